import Hummingbird
import Logging
import ServiceKit

/// The gateway's request context.
public typealias GatewayContext = BasicRequestContext

/// Builds the gateway's router: request ids, request logs, problem+json errors, then the routes.
public func buildRouter(clients: ServiceClients, configuration: GatewayConfiguration) -> Router<GatewayContext> {
    let router = Router(context: GatewayContext.self)
    router.middlewares.add(RequestIdMiddleware())
    router.middlewares.add(LogRequestsMiddleware(.info))
    router.middlewares.add(ProblemMiddleware())
    HealthController(clients: clients, readinessTimeout: configuration.readinessTimeout).addRoutes(to: router)
    return router
}

/// Builds the gateway: its bus clients and its HTTP server, from its configuration.
public func buildApplication(configuration: GatewayConfiguration, logger: Logger = Logger(label: "gateway")) -> some ApplicationProtocol {
    let clients = ServiceClients(configuration: configuration)
    return Application(
        router: buildRouter(clients: clients, configuration: configuration),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "gateway"),
        services: [clients],
        logger: logger
    )
}
