import Blobs
import Bus
import Foundation
import Hummingbird
import Logging
import Metrics
import NIOPosix
import Prometheus
import ServiceKit
import ServiceLifecycle

/// Builds the gateway's router: metrics, request ids, one access line per request, problem+json
/// errors, then the routes.
public func buildRouter(
    clients: ServiceClients,
    authenticator: Authenticator,
    configuration: GatewayConfiguration,
    streams: JobStreams,
    blobs: (any BlobStore)? = nil,
    metrics: PrometheusCollectorRegistry = PrometheusCollectorRegistry(),
    logger: Logger = Logger(label: "gateway"),
    now: @escaping @Sendable () -> Date = Date.init
) -> Router<GatewayContext> {
    let router = Router(context: GatewayContext.self)
    let httpMetrics = HTTPMetricsMiddleware<GatewayContext>()
    router.middlewares.add(httpMetrics)
    // A span per request when the process traces (`ProcessTracing`, bootstrapped before the
    // router is built), continuing the app's W3C `traceparent`; query parameters that sign or
    // search are not recorded.
    if BusTracing.enabled {
        router.middlewares.add(TracingMiddleware(recordingHeaders: [], redactingQueryParameters: [
            "sig", "exp", "token", "q", "cursor", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
        ]))
    }
    router.middlewares.add(RequestIdMiddleware())
    router.middlewares.add(AccessLogMiddleware())
    router.middlewares.add(ProblemMiddleware())
    router.middlewares.add(GuestAdmissionMiddleware(
        clients: clients, networks: configuration.clientNetworks, attestedOnly: configuration.appAttest?.required ?? false
    ))
    HealthController(clients: clients, readinessTimeout: configuration.readinessTimeout).addRoutes(to: router)
    OpenAPIController(path: configuration.openAPIFile, logger: logger).addRoutes(to: router)
    MetricsController(registry: metrics, clients: clients).addRoutes(to: router)
    UsersController(clients: clients, authenticator: authenticator).addRoutes(to: router)
    DevicesController(clients: clients, authenticator: authenticator).addRoutes(to: router)
    AdminController(clients: clients, authenticator: authenticator, logger: logger).addRoutes(to: router)
    WebhooksController(clients: clients, authenticator: authenticator, adaptySecret: configuration.adaptyWebhookSecret, logger: logger).addRoutes(to: router)
    AttestationController(
        clients: clients, networks: configuration.clientNetworks, settings: configuration.appAttest,
        challenges: AttestationChallenges(secret: configuration.urlSigningSecret), now: now
    ).addRoutes(to: router)
    // Routers built for tests that need no files leave the blob routes out; the gateway's own
    // `buildApplication` always opens its store (and stops if it cannot).
    if let blobs { addFileRoutes(to: router, blobs: blobs, clients: clients, authenticator: authenticator, configuration: configuration, streams: streams, logger: logger) }
    // Last: with every route known, a known path asked with another method answers 405, and
    // each route's metrics exist at zero before its first request.
    router.middlewares.add(MethodNotAllowedMiddleware<GatewayContext>(routes: router.routes))
    httpMetrics.prepare(routes: router.routes.map { ($0.path.description, $0.method) })
    return router
}

/// The routes that read or write files: uploads, jobs, history, shares, the older build's routes.
private func addFileRoutes(
    to router: Router<GatewayContext>, blobs: any BlobStore, clients: ServiceClients, authenticator: Authenticator,
    configuration: GatewayConfiguration, streams: JobStreams, logger: Logger
) {
    let links = DownloadLinks(blobs: blobs, publicBaseURL: configuration.publicBaseURL, lifetime: configuration.signedURLLifetime)
    LegacyJobsController(clients: clients, authenticator: authenticator, links: links).addRoutes(to: router)
    let creator = JobCreator(
        clients: clients, uploads: UploadCheck(blobs: blobs, maxBytes: configuration.uploadMaxBytes, maxPixels: configuration.imageMaxPixels),
        prices: EffectPrices(clients: clients), idempotencyWindow: TimeInterval(configuration.idempotencyWindow)
    )
    ProviderWebhooksController(
        clients: clients, webhooks: WebhookSigner(secret: configuration.urlSigningSecret, publicBaseURL: configuration.publicBaseURL),
        signatures: FalWebhookSignature(jwksURL: configuration.falWebhookJWKSURL), logger: logger
    ).addRoutes(to: router)
    UploadsController(
        clients: clients, authenticator: authenticator, blobs: blobs, signer: URLSigner(secret: configuration.urlSigningSecret),
        maxBytes: configuration.uploadMaxBytes, maxPixels: configuration.imageMaxPixels, lifetime: configuration.signedURLLifetime,
        failures: FailureLog(logger: logger), requireQuota: configuration.uploadsRequireQuota
    ).addRoutes(to: router)
    JobsController(clients: clients, authenticator: authenticator, creator: creator, links: links, streams: streams).addRoutes(to: router)
    AdminJobsController(clients: clients, authenticator: authenticator, links: links, blobs: blobs).addRoutes(to: router)
    ConsoleController<GatewayContext>().addRoutes(to: router)
    AdminDispatchController(clients: clients, authenticator: authenticator).addRoutes(to: router)
    HistoryController(
        clients: clients, authenticator: authenticator, creator: creator, links: links, shareLifetime: configuration.shareLifetime
    ).addRoutes(to: router)
    SharesController(clients: clients, blobs: blobs, redirectLifetime: 60).addRoutes(to: router)
}

/// Builds the gateway: its bus clients, its authenticator and its HTTP server, from its
/// configuration. `metrics` is the registry `/metrics` shows: the one the process bootstrapped
/// swift-metrics with (the gateway's main does; in-process tests leave metrics off).
/// `firstServices` run before the gateway's own and stop after them (the trace exporter).
/// `eventLoops`: the HTTP event loops, when the process runs Swift's tasks on them (the main's
/// `GATEWAY_TASKS_ON_EVENT_LOOPS`): the bus clients open their sockets there as they start.
public func buildApplication(
    configuration: GatewayConfiguration, metrics: PrometheusCollectorRegistry = PrometheusCollectorRegistry(), logger: Logger = Logger(label: "gateway"),
    firstServices: [any Service] = [], eventLoops: MultiThreadedEventLoopGroup? = nil
) async throws -> some ApplicationProtocol {
    let authenticator = try await Authenticator(jwtSecret: configuration.jwtSecret, adminToken: configuration.adminToken, viewerToken: configuration.viewerToken)
    // A store that cannot be opened stops the gateway here, with one line saying why.
    let blobs = try await configuration.blobs.open()
    logger.info("blob store open", metadata: ["store": "\(blobs.kind)"])
    let clients = ServiceClients(configuration: configuration, eventLoops: eventLoops)
    if configuration.publicBaseURLGuessed {
        logger.warning("PUBLIC_BASE_URL is not set and the gateway listens on every interface: signed URLs name \(configuration.publicBaseURL), which only this machine reaches; set PUBLIC_BASE_URL to the address apps reach")
    }
    if configuration.jwtSecret == nil { logger.warning("JWT_SECRET is not set: every bearer token will be refused") }
    if configuration.adminToken == nil { logger.warning("ADMIN_TOKEN is not set: every admin call will be refused") }
    let limits = configuration.clientLimits
    // The gateway's own counters exist at zero from the start (the HTTP ones: `buildRouter`).
    _ = (ConnectionGuard.refused, ConnectionGuard.slowBodies, Metrics.Counter(label: "gateway_uploads_aborted_total"))
    let connections = ConnectionCount()
    let streams = JobStreams(
        jobs: clients.jobs, perUser: configuration.streamsPerUser, total: configuration.streamsTotal,
        keepalive: configuration.streamKeepalive, logger: logger
    )
    return Application(
        router: buildRouter(clients: clients, authenticator: authenticator, configuration: configuration, streams: streams, blobs: blobs, metrics: metrics, logger: logger),
        server: .http1(configuration: .init(
            additionalChannelHandlers: [ConnectionGuard(limits: limits, count: connections)],
            idleTimeout: .nanoseconds(Int64(limits.idleTimeout / .nanoseconds(1)))
        )),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "gateway"),
        // The clients first: a service group stops its services in reverse order.
        // (Each named by its type in the group's log lines, never by its value: `NamedService`.)
        services: (firstServices + [clients, streams]).map(NamedService.init),
        logger: logger
    )
}
