import Bus
import Messages
import NIOPosix
import ServiceKit
import ServiceLifecycle

/// The gateway's bus clients, one per service. They run as one of the application's services (so
/// that they stop after the HTTP server), or for a scope with `running(_:)`.
public struct ServiceClients: Service {
    public let quota: BusClient
    public let history: BusClient
    public let jobs: BusClient

    /// Connects a client to each endpoint in `configuration`. With `eventLoops` (the HTTP server's,
    /// when the process runs Swift's tasks on them), each client opens its socket on every loop as
    /// it starts (`BusClient.openLanes(on:)`); calls made on other loops open theirs at the first.
    public init(configuration: GatewayConfiguration, eventLoops: MultiThreadedEventLoopGroup? = nil) {
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
        self.eventLoops = eventLoops
    }

    /// The loops whose sockets open as the clients start.
    private let eventLoops: MultiThreadedEventLoopGroup?

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
                if let eventLoops { client.openLanes(on: eventLoops) }
            }
        }
    }

    /// Runs every client for the duration of `body`.
    public func running<T>(isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T) async throws -> T {
        try await whileRunning(isolation: isolation, { await run() }, body)
    }
}
