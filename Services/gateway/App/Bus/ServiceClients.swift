import Bus
import Messages
import ServiceKit
import ServiceLifecycle

/// The gateway's bus clients, one per service. They run as one of the application's services (so
/// that they stop after the HTTP server), or for a scope with `running(_:)`.
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

    /// Runs every client until the task is cancelled or the service group shuts down gracefully.
    public func run() async {
        await withDiscardingTaskGroup { group in
            for service in ServiceName.allCases {
                let client = client(for: service)
                group.addTask { await client.run() }
            }
        }
    }

    /// Runs every client for the duration of `body`.
    public func running<T>(isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T) async throws -> T {
        try await whileRunning(isolation: isolation, { await run() }, body)
    }
}
