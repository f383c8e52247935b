/// A typed bus method: its wire name tied to its request and reply types, so a call site cannot
/// send the wrong body or decode the wrong reply.
public struct BusMethod<Request: Codable & Sendable, Reply: Codable & Sendable>: Sendable {
    /// The name on the wire, unique within a service, such as `health` or `quota.reserve`.
    public let name: String
    /// The callers that may call it. Declared with the method (no default), so a new method
    /// cannot forget to; enforced when callers are known by key (`BUS_CURVE_CLIENTS`).
    public let roles: Set<BusRole>
    /// Whether a call may be sent again when the connection it went out on broke before the
    /// reply (`connection_lost`): true for reads and for writes that are idempotent by a key the
    /// request carries (a job id, an event id). Against a service's replicas, the call is then
    /// retried on another (`BusClient`).
    public let retrySafe: Bool

    public init(_ name: String, roles: Set<BusRole>, retrySafe: Bool = false) {
        self.name = name
        self.roles = roles
        self.retrySafe = retrySafe
    }
}

/// Who calls on the bus, as a service's allow-list of CURVE keys says (`BUS_CURVE_CLIENTS`): one
/// of the processes, or the operator's tools.
public struct BusRole: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let gateway = BusRole(rawValue: "gateway")
    public static let jobs = BusRole(rawValue: "jobs")
    public static let history = BusRole(rawValue: "history")
    public static let quota = BusRole(rawValue: "quota")
    public static let worker = BusRole(rawValue: "worker")
    public static let `operator` = BusRole(rawValue: "operator")

    /// Every role a key may have.
    public static let known: [BusRole] = [.gateway, .jobs, .history, .quota, .worker, .operator]
    /// Every role but `worker`: a worker host runs third-party model code and speaks only the
    /// worker protocol.
    public static let services: Set<BusRole> = [.gateway, .jobs, .history, .quota, .operator]

    public var description: String { rawValue }
}

/// A body for requests and replies that carry nothing.
public struct Empty: Codable, Sendable, Equatable {
    public init() {}
}
