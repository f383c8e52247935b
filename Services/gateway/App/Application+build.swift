import Blobs
import Bus
import Foundation
import Hummingbird
import Logging
import Prometheus
import ServiceKit

/// The gateway's request context.
public typealias GatewayContext = BasicRequestContext

/// Builds the gateway's router: metrics, request ids, one access line per request, problem+json
/// errors, then the routes.
public func buildRouter(
    clients: ServiceClients,
    authenticator: Authenticator,
    configuration: GatewayConfiguration,
    streams: JobStreams,
    metrics: PrometheusCollectorRegistry = PrometheusCollectorRegistry(),
    logger: Logger = Logger(label: "gateway")
) -> Router<GatewayContext> {
    let router = Router(context: GatewayContext.self)
    router.middlewares.add(MetricsMiddleware())
    router.middlewares.add(RequestIdMiddleware())
    router.middlewares.add(AccessLogMiddleware())
    router.middlewares.add(ProblemMiddleware())
    HealthController(clients: clients, readinessTimeout: configuration.readinessTimeout).addRoutes(to: router)
    OpenAPIController(path: configuration.openAPIFile, logger: logger).addRoutes(to: router)
    MetricsController(registry: metrics, clients: clients).addRoutes(to: router)
    UsersController(clients: clients, authenticator: authenticator).addRoutes(to: router)
    AdminController(clients: clients, authenticator: authenticator).addRoutes(to: router)
    let signer = URLSigner(secret: configuration.urlSigningSecret)
    let links = DownloadLinks(signer: signer, publicBaseURL: configuration.publicBaseURL, lifetime: configuration.signedURLLifetime)
    LegacyJobsController(clients: clients, authenticator: authenticator, links: links).addRoutes(to: router)
    WebhooksController(clients: clients, authenticator: authenticator, adaptySecret: configuration.adaptyWebhookSecret, logger: logger).addRoutes(to: router)
    if let blobs = try? DiskBlobStore(root: URL(fileURLWithPath: configuration.blobDirectory)) {
        let creator = JobCreator(clients: clients, uploads: BlobMetadataCache(store: blobs))
        UploadsController(
            clients: clients, authenticator: authenticator, blobs: blobs, signer: signer, publicBaseURL: configuration.publicBaseURL,
            maxBytes: configuration.uploadMaxBytes, maxPixels: configuration.imageMaxPixels, lifetime: configuration.signedURLLifetime,
            failures: FailureLog(logger: logger), requireQuota: configuration.uploadsRequireQuota
        ).addRoutes(to: router)
        JobsController(clients: clients, authenticator: authenticator, creator: creator, links: links, streams: streams).addRoutes(to: router)
        HistoryController(
            clients: clients, authenticator: authenticator, creator: creator, links: links, shareLifetime: configuration.shareLifetime
        ).addRoutes(to: router)
        SharesController(clients: clients, blobs: blobs).addRoutes(to: router)
    }
    return router
}

/// Builds the gateway: its bus clients, its authenticator and its HTTP server, from its
/// configuration. `metrics` is the registry `/metrics` shows: the one the process bootstrapped
/// swift-metrics with (the gateway's main does; in-process tests leave metrics off).
public func buildApplication(
    configuration: GatewayConfiguration, metrics: PrometheusCollectorRegistry = PrometheusCollectorRegistry(), logger: Logger = Logger(label: "gateway")
) async throws -> some ApplicationProtocol {
    let authenticator = try await Authenticator(jwtSecret: configuration.jwtSecret, adminToken: configuration.adminToken)
    let clients = ServiceClients(configuration: configuration)
    if configuration.jwtSecret == nil { logger.warning("JWT_SECRET is not set: every bearer token will be refused") }
    if configuration.adminToken == nil { logger.warning("ADMIN_TOKEN is not set: every admin call will be refused") }
    let streams = JobStreams(jobs: clients.jobs, perUser: configuration.streamsPerUser, total: configuration.streamsTotal, logger: logger)
    return Application(
        router: buildRouter(clients: clients, authenticator: authenticator, configuration: configuration, streams: streams, metrics: metrics, logger: logger),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "gateway"),
        services: [streams, clients],
        logger: logger
    )
}
