import Messages
import Synchronization
import Tracing

/// Spans for bus calls and handlers, when the process traces (`ProcessTracing` turns it on once
/// an OpenTelemetry exporter is configured): a client span around each call, whose context
/// travels in the request's envelope as a W3C `traceparent`, and a server span around each
/// handler, its child. When the process does not trace, nothing is made or sent.
public enum BusTracing {
    private static let on = Atomic<Bool>(false)

    /// Whether this process makes spans; set once, at start.
    public static var enabled: Bool {
        get { on.load(ordering: .relaxed) }
        set { on.store(newValue, ordering: .relaxed) }
    }

    /// The current span's context as a `traceparent` (empty when there is none), as the
    /// process's propagator writes it.
    public static func currentTraceParent() -> String {
        guard enabled, let context = ServiceContext.current else { return "" }
        var carrier: [String: String] = [:]
        InstrumentationSystem.instrument.inject(context, into: &carrier, using: DictionaryInjector())
        return carrier["traceparent"] ?? ""
    }

    /// A service context continuing `traceParent` (a W3C `traceparent`), or the top level when
    /// it is empty or malformed.
    public static func context(continuing traceParent: String) -> ServiceContext {
        var context = ServiceContext.topLevel
        guard !traceParent.isEmpty else { return context }
        InstrumentationSystem.instrument.extract(["traceparent": traceParent], into: &context, using: DictionaryExtractor())
        return context
    }

    /// Runs a call to `method` inside a client span; `body` gets the `traceparent` to send.
    static func call<T>(_ method: String, _ body: (String) async -> Result<T, BusError>) async -> Result<T, BusError> {
        guard enabled else { return await body("") }
        return await withSpan(method, ofKind: .client) { span in
            span.attributes["rpc.system"] = "photoedit-bus"
            span.attributes["rpc.method"] = method
            let result = await body(currentTraceParent())
            if case .failure(let error) = result {
                span.attributes["rpc.photoedit.code"] = error.code.rawValue
                span.setStatus(SpanStatus(code: .error, message: error.code.rawValue))
            }
            return result
        }
    }

    /// Runs the handler of `method` inside a server span, child of the caller's `traceParent`.
    static func handle(_ method: String, traceParent: String, _ body: () async -> Result<[UInt8], BusError>) async -> Result<[UInt8], BusError> {
        guard enabled else { return await body() }
        return await withSpan(method, context: context(continuing: traceParent), ofKind: .server) { span in
            span.attributes["rpc.system"] = "photoedit-bus"
            span.attributes["rpc.method"] = method
            let result = await body()
            if case .failure(let error) = result {
                span.attributes["rpc.photoedit.code"] = error.code.rawValue
                span.setStatus(SpanStatus(code: .error, message: error.code.rawValue))
            }
            return result
        }
    }
}

extension BusTracing {
    /// Records a moment of the trace `traceParent` names (a job handed to a worker) as a span
    /// of no length; returns its `traceparent`, for what continues from it elsewhere. Nil when
    /// the process does not trace or there is no trace to join.
    public static func mark(_ name: String, continuing traceParent: String?, ofKind kind: SpanKind, attributes: [String: String] = [:]) -> String? {
        guard enabled, let traceParent, !traceParent.isEmpty else { return nil }
        let span = InstrumentationSystem.tracer.startSpan(name, context: context(continuing: traceParent), ofKind: kind)
        for (key, value) in attributes { span.attributes[key] = value }
        var carrier: [String: String] = [:]
        InstrumentationSystem.instrument.inject(span.context, into: &carrier, using: DictionaryInjector())
        span.end()
        return carrier["traceparent"]
    }

    /// Runs `body` in a span child of `traceParent` (a new trace when it is nil), when the
    /// process traces; the work `body` does, HTTP calls included, joins it.
    public static func span<T>(
        _ name: String, continuing traceParent: String?, ofKind kind: SpanKind, attributes: [String: String] = [:], _ body: () async -> T
    ) async -> T {
        guard enabled else { return await body() }
        return await withSpan(name, context: context(continuing: traceParent ?? ""), ofKind: kind) { span in
            for (key, value) in attributes { span.attributes[key] = value }
            return await body()
        }
    }
}

extension BusTracing {
    /// Runs `body` in a span child of `traceParent`, when the process traces and there is a
    /// trace to join (work done for no traced request makes no span).
    public static func childSpan<T>(
        _ name: String, of traceParent: String, ofKind kind: SpanKind, attributes: [String: String] = [:], _ body: () async throws -> T
    ) async rethrows -> T {
        guard enabled, !traceParent.isEmpty else { return try await body() }
        return try await withSpan(name, context: context(continuing: traceParent), ofKind: kind) { span in
            for (key, value) in attributes { span.attributes[key] = value }
            return try await body()
        }
    }

    /// A span for work that serves several traced requests at once (a group commit), linked to
    /// each of `traceParents` (the empty ones skipped); nil when the process does not trace or
    /// none of them is traced. The caller ends it.
    public static func linkedSpan(_ name: String, linking traceParents: [String], attributes: [String: String] = [:]) -> (any Span)? {
        guard enabled else { return nil }
        let traced = traceParents.filter { !$0.isEmpty }
        guard !traced.isEmpty else { return nil }
        let span = InstrumentationSystem.tracer.startSpan(name, context: .topLevel, ofKind: .internal)
        for (key, value) in attributes { span.attributes[key] = value }
        for traceParent in traced { span.addLink(SpanLink(context: context(continuing: traceParent), attributes: [:])) }
        return span
    }

    /// Runs `body` in a `linkedSpan` (when there is one): work for several traced jobs at once,
    /// such as an outbox delivery, whose bus calls are then its children.
    public static func withLinkedSpan<T>(_ name: String, linking traceParents: [String], _ body: () async throws -> T) async rethrows -> T {
        guard let span = linkedSpan(name, linking: traceParents) else { return try await body() }
        defer { span.end() }
        return try await ServiceContext.withValue(span.context) { try await body() }
    }
}

/// Writes a service context's fields into a dictionary (the propagator's `traceparent`).
public struct DictionaryInjector: Injector {
    public init() {}
    public func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}

/// Reads a service context's fields from a dictionary.
public struct DictionaryExtractor: Extractor {
    public init() {}
    public func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}
