import Bus
import Foundation
import Messages

/// Answers the `health` method: who this service is, its version, uptime and pid.
public struct HealthHandler: Sendable {
    public let service: String
    private let started = ContinuousClock.now

    public init(service: String) { self.service = service }

    /// This process's report now.
    public func report() -> HealthReport {
        let uptime = started.duration(to: .now)
        let seconds = Double(uptime.components.seconds) + Double(uptime.components.attoseconds) / 1e18
        return HealthReport(
            service: service,
            version: BuildInfo.version,
            uptimeSeconds: seconds,
            pid: ProcessInfo.processInfo.processIdentifier
        )
    }

    /// Registers `health` on `router`.
    public func register(on router: inout BusRouter) {
        router.register(Health.check) { _, _ in report() }
    }
}
