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
        for route in routes { _ = cache.handles(route: route.path, method: Self.label(route.method), status: nil) }
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
        let handles = cache.handles(route: route, method: method, status: status)
        handles.requests?.increment()
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

/// The metric handles by route and method (and status), made once each and found under one lock
/// a request.
final class HTTPMetricsCache: Sendable {
    struct Handles: Sendable {
        let duration: Metrics.Timer
        let errors: Counter
        /// The requests counter of the status asked for; nil when none was.
        var requests: Counter?
    }
    private struct Key: Hashable {
        let route: String
        let method: String
    }
    private struct Entry {
        let duration: Metrics.Timer
        let errors: Counter
        var byStatus: [Int: Counter] = [:]
    }
    static let active = Meter(label: "http_server_active_requests")
    private let entries = Mutex<[Key: Entry]>([:])

    func handles(route: String, method: String, status: Int?) -> Handles {
        entries.withLock { entries in
            let key = Key(route: route, method: method)
            // A route seen before with this status is found without making anything (the
            // dimensions and labels are made once, for the first request of each).
            if let entry = entries[key], let status, let requests = entry.byStatus[status] {
                return Handles(duration: entry.duration, errors: entry.errors, requests: requests)
            }
            let dimensions = [("http_route", route), ("http_request_method", method)]
            var entry = entries[key] ?? Entry(
                duration: Metrics.Timer(label: "http_server_request_duration_seconds", dimensions: dimensions),
                errors: Counter(label: "http_server_request_errors_total", dimensions: dimensions)
            )
            var requests: Counter?
            if let status {
                requests = entry.byStatus[status] ?? Counter(label: "http_server_requests_total", dimensions: dimensions + [("http_response_status_code", "\(status)")])
                entry.byStatus[status] = requests
            }
            entries[key] = entry
            return Handles(duration: entry.duration, errors: entry.errors, requests: requests)
        }
    }
}
