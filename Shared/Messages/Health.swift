/// The `health` method every service answers.
public enum Health {
    /// Asks a service who it is and how long it has been up.
    public static let check = BusMethod<Empty, HealthReport>("health", roles: BusRole.services, retrySafe: true)
}

/// A service's answer to `health`.
public struct HealthReport: Codable, Sendable, Equatable {
    /// The service's name, such as `quota`.
    public var service: String
    /// The build's version.
    public var version: String
    /// Seconds since the process started.
    public var uptimeSeconds: Double
    /// The process id.
    public var pid: Int32

    public init(service: String, version: String, uptimeSeconds: Double, pid: Int32) {
        self.service = service
        self.version = version
        self.uptimeSeconds = uptimeSeconds
        self.pid = pid
    }
}
