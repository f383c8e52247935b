import Logging
import Messages

/// What a handler knows about the request it serves.
public struct BusRequestContext: Sendable {
    /// The method's wire name.
    public var method: String
    /// The trace id the caller sent (the gateway's `X-Request-Id`), empty if none.
    public var traceId: String
    /// Wall-clock milliseconds since 1970 after which nobody waits for the reply.
    public var deadlineMilliseconds: Int64
    /// The caller's role as its key says (`BusAuthentication`), nil when callers are not known by
    /// key (no allow-list: plain text, or CURVE without one).
    public var callerRole: BusRole?
    /// The service's logger, without this request's metadata.
    private var baseLogger: Logger

    /// A logger carrying `request-id` and `method` metadata, made when asked for: most requests
    /// log nothing, and adding metadata to a logger costs allocations on every request.
    public var logger: Logger {
        get {
            var logger = baseLogger
            logger[metadataKey: "request-id"] = "\(traceId)"
            logger[metadataKey: "method"] = "\(method)"
            return logger
        }
        set { baseLogger = newValue }
    }

    public init(method: String, traceId: String, deadlineMilliseconds: Int64, callerRole: BusRole? = nil, logger: Logger) {
        self.callerRole = callerRole
        self.method = method
        self.traceId = traceId
        self.deadlineMilliseconds = deadlineMilliseconds
        self.baseLogger = logger
    }
}

/// Turns errors a handler throws that are not `BusError`s, but that it recognises (a full disk,
/// say), into typed bus errors.
public struct BusErrorTranslator: Sendable {
    public let translate: @Sendable (any Error) -> BusError?
    public init(_ translate: @escaping @Sendable (any Error) -> BusError?) { self.translate = translate }
}

/// A service's methods: typed handlers registered by descriptor, dispatched by wire name.
/// Usable without sockets, which is how handlers are unit-tested.
public struct BusRouter: Sendable {
    typealias RawHandler = @Sendable ([UInt8], BusEncoding, BusRequestContext) async -> Result<[UInt8], BusError>

    private var handlers: [String: RawHandler] = [:]
    private let translator: BusErrorTranslator?
    private let failures: FailureLog?

    /// A router whose handlers' untyped errors become `internal`; `translator` turns the ones it
    /// knows (a full disk, say) into typed errors instead, logged through `failures` once per
    /// kind rather than once per request.
    public init(translator: BusErrorTranslator? = nil, failures: FailureLog? = nil) {
        self.translator = translator
        self.failures = failures
    }

    /// Registers `handler` for `method`. A handler throws a `BusError` for a typed failure; any
    /// other error is translated, or logged and answered as `internal`.
    public mutating func register<Request, Reply>(
        _ method: BusMethod<Request, Reply>,
        _ handler: @escaping @Sendable (Request, BusRequestContext) async throws -> Reply
    ) {
        let translator = self.translator, failures = self.failures
        let roles = method.roles
        handlers[method.name] = { body, encoding, context in
            // A known caller outside the method's roles is refused before anything is read.
            if let role = context.callerRole, !roles.contains(role) {
                return .failure(BusError(.forbidden, "\(method.name) is not for callers with the role \(role)"))
            }
            let request: Request
            do {
                request = try BusCodec.decode(Request.self, from: body, as: encoding)
            } catch {
                return .failure(BusError(.badRequest, "body is not a valid \(Request.self): \(Self.describe(error))"))
            }
            do {
                let reply = try await handler(request, context)
                return .success(try BusCodec.encode(reply, as: encoding))
            } catch let error as BusError {
                return .failure(error)
            } catch is CancellationError {
                return .failure(BusError(.cancelled, "cancelled"))
            } catch {
                if let translated = translator?.translate(error) {
                    failures?.record(translated.code.rawValue, "\(method.name) failed: \(translated.message)")
                    return .failure(translated)
                }
                context.logger.error("handler failed", metadata: ["error": "\(error)"])
                return .failure(BusError(.internal, "\(method.name) failed"))
            }
        }
    }

    /// Whether `method` is registered.
    public func knows(_ method: String) -> Bool { handlers[method] != nil }

    /// The names of the registered methods.
    public var methods: [String] { handlers.keys.sorted() }

    /// Runs the handler for `method` on a body in `encoding`, and encodes its reply the same way;
    /// `unknown_method` if there is none.
    public func handle(method: String, body: [UInt8], encoding: BusEncoding = .binary, context: BusRequestContext) async -> Result<[UInt8], BusError> {
        guard let handler = handlers[method] else {
            return .failure(BusError(.unknownMethod, "no method named '\(method)'"))
        }
        return await handler(body, encoding, context)
    }

    /// Calls a typed method directly, without sockets: encode, dispatch, decode.
    public func call<Request, Reply>(
        _ method: BusMethod<Request, Reply>,
        _ request: Request,
        encoding: BusEncoding = .binary,
        context: BusRequestContext
    ) async throws(BusError) -> Reply {
        let body: [UInt8]
        do { body = try BusCodec.encode(request, as: encoding) } catch { throw BusError(.badRequest, "\(error)") }
        switch await handle(method: method.name, body: body, encoding: encoding, context: context) {
        case .failure(let error):
            throw error
        case .success(let bytes):
            do { return try BusCodec.decode(Reply.self, from: bytes, as: encoding) } catch {
                throw BusError(.badReply, "\(error)")
            }
        }
    }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, _): "missing field '\(key.stringValue)'"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            "wrong type at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case DecodingError.dataCorrupted(let context): context.debugDescription
        default: "\(error)"
        }
    }
}
