import Hummingbird
import Prometheus

/// `GET /metrics`: the gateway's metrics in the Prometheus text format: HTTP requests by route
/// template, method and status (`hb_requests`), their durations (`http_server_request_duration`,
/// a histogram), requests in progress (`http_server_active_requests`). Recorded by Hummingbird's
/// `MetricsMiddleware` through swift-metrics into the registry the gateway process bootstraps.
struct MetricsController<Context: RequestContext>: Sendable {
    let registry: PrometheusCollectorRegistry

    func addRoutes(to router: Router<Context>) {
        router.get("/metrics") { _, _ in
            Response(
                status: .ok,
                headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer()))
            )
        }
    }
}
