/// The error a bus call ends with: produced by the bus itself (timeout, overloaded, ...) or sent
/// back by a service as its own typed error. It travels on the wire as `{code, message, retryable}`.
public struct BusError: Error, Codable, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong, machine-readable.
    public var code: Code
    /// What went wrong, for people.
    public var message: String
    /// Whether the same request may succeed if sent again later.
    public var retryable: Bool

    public init(_ code: Code, _ message: String, retryable: Bool? = nil) {
        self.code = code
        self.message = message
        self.retryable = retryable ?? code.isRetryableByDefault
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// An error code: the bus's own are static members; a service defines its own with a dotted
    /// name (`quota.denied`) so codes stay open to extension.
    public struct Code: RawRepresentable, Codable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public init(_ rawValue: String) { self.rawValue = rawValue }

        public init(from decoder: any Decoder) throws {
            rawValue = try decoder.singleValueContainer().decode(String.self)
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(rawValue)
        }

        /// No reply came before the request's deadline.
        public static let timeout = Code("timeout")
        /// The connection to the service broke with the request sent and no reply (the service
        /// died, say): it may or may not have been handled, as with a timeout, but the caller
        /// hears at once instead of at the deadline. Also, at the deadline, a request sent while
        /// no connection was up (the service down or starting) and not answered since.
        public static let connectionLost = Code("connection_lost")
        /// The service cannot be reached, is shutting down, or the caller is closed.
        public static let unavailable = Code("unavailable")
        /// The service (or the caller's own queue) holds as many requests as it may; try later.
        public static let overloaded = Code("overloaded")
        /// The service has no method of that name.
        public static let unknownMethod = Code("unknown_method")
        /// The request could not be decoded or is invalid.
        public static let badRequest = Code("bad_request")
        /// The reply could not be decoded as the method's reply type.
        public static let badReply = Code("bad_reply")
        /// The thing asked for does not exist (or belongs to someone else).
        public static let notFound = Code("not_found")
        /// The caller's role (its key) may not call this method.
        public static let forbidden = Code("forbidden")
        /// The request conflicts with the current state.
        public static let conflict = Code("conflict")
        /// The caller's task was cancelled before the reply came.
        public static let cancelled = Code("cancelled")
        /// The service failed in a way it did not expect.
        public static let `internal` = Code("internal")
        /// The service's disk is full: nothing was written; the same request may succeed once an
        /// operator frees space.
        public static let storageFull = Code("storage_full")
        /// The service's storage failed for another reason (an I/O error, a locked file):
        /// nothing was written; try again shortly.
        public static let storageUnavailable = Code("storage_unavailable")

        var isRetryableByDefault: Bool {
            self == .timeout || self == .connectionLost || self == .unavailable || self == .overloaded || self == .storageFull || self == .storageUnavailable
        }
    }
}
