/// A typed bus method: its wire name tied to its request and reply types, so a call site cannot
/// send the wrong body or decode the wrong reply.
public struct BusMethod<Request: Codable & Sendable, Reply: Codable & Sendable>: Sendable {
    /// The name on the wire, unique within a service, such as `health` or `quota.reserve`.
    public let name: String

    public init(_ name: String) { self.name = name }
}

/// A body for requests and replies that carry nothing.
public struct Empty: Codable, Sendable, Equatable {
    public init() {}
}
