import Logging
import ServiceLifecycle

/// A service as a `ServiceGroup` names it in its log lines: by its type only. A group names a
/// service by `"\(service)"`, the whole value, so a worker at `debug` logged its configuration,
/// CURVE secret key included, in its `Starting service` line. Every service a process runs in a
/// group (Hummingbird's included) is wrapped in one of these.
public struct NamedService: Service, CustomStringConvertible, CustomDebugStringConvertible {
    public let service: any Service

    public init(_ service: any Service) { self.service = service }

    public var description: String { String(describing: type(of: service)) }
    public var debugDescription: String { description }

    public func run() async throws { try await service.run() }
}

extension ServiceGroupConfiguration {
    /// A group of `services`, each named by its type (`NamedService`), stopped gracefully on
    /// SIGTERM and SIGINT.
    public init(named services: [any Service], logger: Logger) {
        self.init(services: services.map { NamedService($0) }, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
    }
}
