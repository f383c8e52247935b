import Dispatch
import HTTPTypes
import Hummingbird
import Metrics
import Synchronization

/// The gateway's HTTP metrics, named as Prometheus' conventions ask (base units, `_total` on
/// counters) with OpenTelemetry's attribute names as labels:
/// - `http_server_requests_total{http_route, http_request_method, http_response_status_code}`;
/// - `http_server_request_duration_seconds{http_route, http_request_method}` (histogram): from
///   the request's arrival to its response's head, so a streamed body (an event stream, a file)
///   counts until it starts;
/// - `http_server_request_errors_total{http_route, http_request_method}`: 5xx answers;
/// - `http_server_active_requests`: requests in progress.
///
/// `prepare(routes:)` creates the duration and error series of every route at zero, so that
/// `rate()` and absence alerts see them from the start. The route is the router's template
/// (`/api/v1/jobs/{jobId}`), `unknown` for a path no route has; a method outside HTTP's own is
/// `other`: neither lets a client add series.
struct HTTPMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    private let cache = HTTPMetricsCache()

    /// Creates the series of `routes` (template and method) at zero.
    func prepare(routes: [(path: String, method: HTTPRequest.Method)]) {
        for route in routes { _ = cache.handles(route: route.path, method: Self.label(route.method)) }
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = DispatchTime.now().uptimeNanoseconds
        HTTPMetricsCache.active.increment()
        let method = Self.label(request.method)
        do {
            let response = try await next(request, context)
            record(context: context, method: method, status: response.status.code, start: start)
            return response
        } catch {
            record(context: context, method: method, status: (error as? any HTTPResponseError)?.status.code ?? 500, start: start)
            throw error
        }
    }

    private func record(context: Context, method: String, status: Int, start: UInt64) {
        let route = context.endpointPath.map { $0 == "NotFound" ? "unknown" : $0 } ?? "unknown"
        let handles = cache.handles(route: route, method: method)
        cache.requests(route: route, method: method, status: status).increment()
        handles.duration.recordNanoseconds(Int64(DispatchTime.now().uptimeNanoseconds - start))
        if status >= 500 { handles.errors.increment() }
        HTTPMetricsCache.active.decrement()
    }

    /// The method as a label: HTTP's own methods by name, any other as `other`.
    static func label(_ method: HTTPRequest.Method) -> String {
        switch method {
        case .get, .head, .post, .put, .delete, .patch, .options, .trace, .connect: method.rawValue
        default: "other"
        }
    }
}

/// The metric handles by route and method (and status), made once each.
final class HTTPMetricsCache: Sendable {
    struct Handles: Sendable {
        let duration: Metrics.Timer
        let errors: Counter
    }
    private struct Key: Hashable {
        let route: String
        let method: String
    }
    private struct StatusKey: Hashable {
        let route: String
        let method: String
        let status: Int
    }
    static let active = Meter(label: "http_server_active_requests")
    private let byRoute = Mutex<[Key: Handles]>([:])
    private let byStatus = Mutex<[StatusKey: Counter]>([:])

    func handles(route: String, method: String) -> Handles {
        byRoute.withLock { cache in
            let key = Key(route: route, method: method)
            if let known = cache[key] { return known }
            let dimensions = [("http_route", route), ("http_request_method", method)]
            let made = Handles(
                duration: Metrics.Timer(label: "http_server_request_duration_seconds", dimensions: dimensions),
                errors: Counter(label: "http_server_request_errors_total", dimensions: dimensions)
            )
            cache[key] = made
            return made
        }
    }

    func requests(route: String, method: String, status: Int) -> Counter {
        byStatus.withLock { cache in
            let key = StatusKey(route: route, method: method, status: status)
            if let known = cache[key] { return known }
            let made = Counter(label: "http_server_requests_total", dimensions: [
                ("http_route", route), ("http_request_method", method), ("http_response_status_code", "\(status)"),
            ])
            cache[key] = made
            return made
        }
    }
}
