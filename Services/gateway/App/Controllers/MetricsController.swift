import Hummingbird
import Messages
import Prometheus
import ServiceKit

/// `GET /metrics`: every process's metrics in one Prometheus text exposition, each sample
/// labelled with the `service` it comes from (`gateway`, `quota`, `history`, `jobs`, and
/// `worker` with a `worker` label). The gateway's own: HTTP requests by route template, method
/// and status, their durations and 5xx answers, requests in progress (`HTTPMetricsMiddleware`).
/// Each family has its HELP text from `MetricsCatalogue`. The services answer `metrics.scrape` on the bus (the jobs service adds
/// what its workers last sent); `photoedit_scrape_up{service}` is 0 for one that did not answer
/// within `scrapeTimeout`, and its samples are missing from that scrape.
struct MetricsController<Context: RequestContext>: Sendable {
    let registry: PrometheusCollectorRegistry
    let clients: ServiceClients
    static var scrapeTimeout: Duration { .seconds(2) }

    func addRoutes(to router: Router<Context>) {
        router.get("/metrics") { _, _ in
            let text = await gather()
            return Response(
                status: .ok,
                headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: text))
            )
        }
    }

    /// The gateway's exposition and each service's, merged.
    func gather() async -> String {
        await ProcessMetrics.refresh()
        let own = MetricsSection(labels: ["service": "gateway"], text: String(decoding: registry.emitToBuffer(), as: UTF8.self))
        let services: [(ServiceName, MetricsSnapshot?)] = await withTaskGroup(of: (ServiceName, MetricsSnapshot?).self) { group in
            for service in ServiceName.allCases {
                group.addTask {
                    (service, try? await clients.client(for: service).call(Telemetry.scrape, Empty(), timeout: Self.scrapeTimeout))
                }
            }
            var answers: [(ServiceName, MetricsSnapshot?)] = []
            for await answer in group { answers.append(answer) }
            return answers.sorted { $0.0.rawValue < $1.0.rawValue }
        }
        var sections = [own]
        var up = "# HELP photoedit_scrape_up Whether the service answered the gateway's metrics scrape.\n# TYPE photoedit_scrape_up gauge\n"
        for (service, snapshot) in services {
            up += "photoedit_scrape_up{service=\"\(service.rawValue)\"} \(snapshot == nil ? 0 : 1)\n"
            for section in snapshot?.sections ?? [] {
                sections.append(MetricsSection(labels: section.labels.merging(["service": service.rawValue]) { mine, _ in mine }, text: section.text))
            }
        }
        sections.append(MetricsSection(labels: [:], text: up))
        return PrometheusText.merge(sections)
    }
}
