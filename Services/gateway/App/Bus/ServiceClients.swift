import Bus
import Messages
import ServiceKit
import ServiceLifecycle

/// The gateway's bus clients, one per service, shut down after the HTTP server stops.
public struct ServiceClients: Service {
    public let quota: BusClient
    public let history: BusClient
    public let jobs: BusClient

    /// Connects a client to each endpoint in `configuration`.
    public init(configuration: GatewayConfiguration) {
        func client(_ service: ServiceName) -> BusClient {
            BusClient(configuration: .init(
                endpoint: configuration.endpoints[service] ?? service.defaultEndpoint,
                defaultTimeout: configuration.busTimeout,
                curve: configuration.curve,
                encoding: configuration.busEncoding
            ))
        }
        quota = client(.quota)
        history = client(.history)
        jobs = client(.jobs)
    }

    /// The client of `service`.
    public func client(for service: ServiceName) -> BusClient {
        switch service {
        case .quota: quota
        case .history: history
        case .jobs: jobs
        }
    }

    /// Calls `method` on `service`; a bus failure becomes the matching HTTP problem.
    public func call<Request, Reply>(
        _ service: ServiceName, _ method: BusMethod<Request, Reply>, _ request: Request
    ) async throws -> Reply {
        do {
            return try await client(for: service).call(method, request)
        } catch {
            throw Problem(error, service: service.rawValue)
        }
    }

    /// Waits for graceful shutdown, then closes every client.
    public func run() async throws {
        try? await gracefulShutdown()
        await shutdown()
    }

    /// Closes every client; calls still waiting fail with `unavailable`.
    public func shutdown() async {
        for service in ServiceName.allCases { await client(for: service).shutdown() }
    }
}
