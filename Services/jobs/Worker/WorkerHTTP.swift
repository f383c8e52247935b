import AsyncHTTPClient
import Bus
import NIOCore
import Tracing

/// The worker's HTTP client: its reads and writes of files (presigned URLs) and its calls to
/// model providers. AsyncHTTPClient's own tracing is off: it records each request's full URL,
/// whose query is a presigned URL's signature (and an S3 access key id). When the worker traces,
/// each request is a client span of its own instead, with the method, the server and the path
/// only, and carries the span's `traceparent`, so the gateway's file routes join the trace.
enum WorkerHTTP {
    /// `HTTPClient.shared`'s settings (redirects, decompression, timeouts), without tracing, and
    /// with up to `connectionsPerHost` connections to one host instead of 8: a model job holds
    /// one to its provider while it waits, and stores its result and thumbnail at once, so 8
    /// made the jobs of a worker of capacity 8 queue for connections to the store.
    static let connectionsPerHost = 64
    static let client: HTTPClient = {
        var configuration = HTTPClient.Configuration.singletonConfiguration
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = connectionsPerHost
        configuration.tracing.tracer = nil
        return HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }()

    static func execute(_ request: HTTPClientRequest, timeout: TimeAmount) async throws -> HTTPClientResponse {
        guard BusTracing.enabled else { return try await client.execute(request, timeout: timeout) }
        let url = URLParts(request.url)
        return try await withSpan(request.method.rawValue, ofKind: .client) { span in
            span.attributes["http.request.method"] = request.method.rawValue
            span.attributes["server.address"] = url.host
            span.attributes["url.path"] = url.path
            var request = request
            let traceParent = BusTracing.currentTraceParent()
            if !traceParent.isEmpty { request.headers.replaceOrAdd(name: "traceparent", value: traceParent) }
            let response = try await client.execute(request, timeout: timeout)
            span.attributes["http.response.status_code"] = Int(response.status.code)
            if response.status.code >= 500 { span.setStatus(SpanStatus(code: .error)) }
            return response
        }
    }

    /// A URL's host and path, without its query or credentials.
    struct URLParts {
        var host = ""
        var path = ""
        init(_ url: String) {
            guard let scheme = url.range(of: "://") else { return }
            let rest = url[scheme.upperBound...]
            let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            host = String(authority.split(separator: "@").last ?? authority)
            path = String(rest.dropFirst(authority.count).prefix { $0 != "?" && $0 != "#" })
        }
    }
}
