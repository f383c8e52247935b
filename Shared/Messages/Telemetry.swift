/// Metrics of a process, gathered by the gateway's `GET /metrics`.
public enum Telemetry {
    /// Asks a service for its metrics in the Prometheus text format, and those of the processes
    /// that report to it (the jobs service answers for its workers).
    public static let scrape = BusMethod<Empty, MetricsSnapshot>("metrics.scrape", roles: BusRole.services)
}

/// One or more Prometheus text expositions, each with the labels that tell whose it is.
public struct MetricsSnapshot: Codable, Sendable, Equatable {
    public var sections: [MetricsSection]
    public init(sections: [MetricsSection]) { self.sections = sections }
}

/// One process's metrics: the Prometheus text exposition (version 0.0.4) and the labels the
/// gatherer adds to each of its samples, such as `worker="worker-1"`.
public struct MetricsSection: Codable, Sendable, Equatable {
    public var labels: [String: String]
    public var text: String
    public init(labels: [String: String], text: String) {
        self.labels = labels
        self.text = text
    }
}
