/// The services on the bus, with the endpoints they bind and callers connect to by default.
public enum ServiceName: String, CaseIterable, Sendable {
    case quota, history, jobs

    /// The default endpoint on loopback.
    public var defaultEndpoint: String {
        switch self {
        case .quota: "tcp://127.0.0.1:7101"
        case .history: "tcp://127.0.0.1:7102"
        case .jobs: "tcp://127.0.0.1:7103"
        }
    }

    /// The variable a service reads for the endpoint it binds, such as `QUOTA_BIND`.
    public var bindVariable: String { rawValue.uppercased() + "_BIND" }

    /// The variable callers read for the endpoint they connect to, such as `QUOTA_ENDPOINT`.
    public var endpointVariable: String { rawValue.uppercased() + "_ENDPOINT" }

    /// The variable for the service's bound on requests in progress, such as `QUOTA_MAX_IN_FLIGHT`.
    public var maxInFlightVariable: String { rawValue.uppercased() + "_MAX_IN_FLIGHT" }
}

/// The build's version, reported by `health`.
public enum BuildInfo {
    public static let version = "0.1.0"
}
