#if canImport(Glibc)
import Glibc
#endif
import Messages
import Metrics
import NIOPosix
import Prometheus
import Synchronization

/// The process's metrics: one Prometheus registry behind swift-metrics, bootstrapped once, and
/// what the process adds when it is scraped (gauges read at that moment, the sections of the
/// processes that report to it).
///
/// Services answer `metrics.scrape` on the bus with `snapshot()`; the gateway gathers them all
/// into its `GET /metrics` with a `service` label. Workers send theirs to the jobs service.
public enum ProcessMetrics {
    /// The registry every metric of this process lives in.
    public static let registry = PrometheusCollectorRegistry()

    private struct State: Sendable {
        var bootstrapped = false
        var refreshers: [@Sendable () async -> Void] = []
        var reporters: [@Sendable () async -> [MetricsSection]] = []
    }
    private static let state = Mutex(State())

    /// Durations from 100 µs (a bus call) to 2 minutes (a slow edit), in seconds.
    public static let durationBuckets: [Duration] = [
        .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2500),
        .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100),
        .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
        .seconds(30), .seconds(60), .seconds(120),
    ]

    /// Makes swift-metrics record into `registry`. Once per process; later calls do nothing.
    public static func bootstrap() {
        let first = state.withLock { state in
            defer { state.bootstrapped = true }
            return !state.bootstrapped
        }
        guard first else { return }
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = durationBuckets
        MetricsSystem.bootstrap(factory)
    }

    /// Runs `refresh` before each scrape: for gauges read from a database or an actor.
    public static func onScrape(_ refresh: @escaping @Sendable () async -> Void) {
        state.withLock { $0.refreshers.append(refresh) }
    }

    /// Adds the sections `report` gives to each scrape: the metrics of other processes.
    public static func addReporter(_ report: @escaping @Sendable () async -> [MetricsSection]) {
        state.withLock { $0.reporters.append(report) }
    }

    /// This process's exposition, as it is now.
    public static func exposition() -> String {
        String(decoding: registry.emitToBuffer(), as: UTF8.self)
    }

    /// Runs the refreshers: the gauges read at the scrape.
    public static func refresh() async {
        let refreshers = state.withLock { $0.refreshers }
        for refresh in refreshers { await refresh() }
    }

    /// Reports the file system of `path` at each scrape: `photoedit_disk_free_bytes` (free to
    /// this process) and `photoedit_disk_size_bytes`. `statvfs` runs on NIO's thread pool, not on
    /// the cooperative pool.
    public static func watchDisk(path: String) {
        let free = Gauge(label: "photoedit_disk_free_bytes")
        let size = Gauge(label: "photoedit_disk_size_bytes")
        onScrape {
            let sizes = try? await NIOThreadPool.singleton.runIfActive { () -> (free: UInt64, size: UInt64)? in
                var status = statvfs()
                guard statvfs(path, &status) == 0 else { return nil }
                return (UInt64(status.f_bavail) * UInt64(status.f_frsize), UInt64(status.f_blocks) * UInt64(status.f_frsize))
            }
            guard let sizes = sizes ?? nil else { return }
            free.record(Int64(clamping: sizes.free))
            size.record(Int64(clamping: sizes.size))
        }
    }

    /// This process's exposition after its refreshers ran, then its reporters' sections.
    public static func snapshot() async -> MetricsSnapshot {
        await refresh()
        let reporters = state.withLock { $0.reporters }
        var sections = [MetricsSection(labels: [:], text: exposition())]
        for report in reporters { sections += await report() }
        return MetricsSnapshot(sections: sections)
    }
}
