import Bus
import Logging
import Messages
import ServiceLifecycle
import ZeroMQ

/// Runs a bus service process: reads its configuration, sets up logging and metrics, binds its
/// endpoint with the methods it registers plus `health` and `metrics.scrape`, and serves until SIGTERM or SIGINT, when it finishes the
/// requests in progress and returns.
public enum BusServiceRunner {
    /// Runs `service` with the methods `register` adds; `extraServices` run beside the bus server
    /// (and are shut down after it). `translateErrors` turns the handlers' untyped errors it
    /// knows (a full disk) into typed bus errors, logged once per kind.
    public static func run(
        _ service: ServiceName,
        environment: Environment = Environment(),
        translateErrors: BusErrorTranslator? = nil,
        register: @Sendable (inout BusRouter, ServiceConfiguration, Logger) async throws -> [any Service] = { _, _, _ in [] }
    ) async throws {
        let configuration = try ServiceConfiguration(service: service, environment: environment)
        try BusSecurity.checkExposure(
            configuration.bindEndpoint, variable: service.bindVariable, curve: configuration.curveSecretKey != nil,
            knownCallers: configuration.knownCallers != nil, environment: environment
        )
        ProcessLogging.bootstrap(level: configuration.logLevel, process: service.rawValue, format: configuration.logFormat)
        let logger = Logger(label: service.rawValue)
        ProcessMetrics.bootstrap()
        ProcessMetrics.watchDisk(path: configuration.dataDirectory)
        let tracing = try ProcessTracing.bootstrap(service: service.rawValue, logger: logger)

        var router = BusRouter(translator: translateErrors, failures: FailureLog(logger: logger))
        HealthHandler(service: service.rawValue).register(on: &router)
        router.register(Telemetry.scrape) { _, _ in await ProcessMetrics.snapshot() }
        let extraServices = try await register(&router, configuration, logger)

        if let callers = configuration.knownCallers {
            try await BusAuthentication.install(callers: callers, logger: logger)
        }
        var serverConfiguration = BusServer.Configuration(
            endpoint: configuration.bindEndpoint,
            maxInFlight: configuration.maxInFlight,
            curveSecretKey: configuration.curveSecretKey
        )
        serverConfiguration.knownCallers = configuration.knownCallers != nil
        let server = BusServer(
            configuration: serverConfiguration,
            router: router,
            logger: logger
        )
        let group = ServiceGroup(
            configuration: .init(
                // The exporter first: it stops last, after the spans of the others are recorded.
                named: (tracing.map { [$0] } ?? []) + extraServices + [server],
                logger: logger
            )
        )
        logger.info("starting", metadata: ["version": "\(BuildInfo.version)", "methods": "\(router.methods.joined(separator: ","))"])
        try await group.run()
        // Let libzmq send the last replies before the process ends with them still queued.
        if !(await ZMQContext.shared.terminate(within: .seconds(3))) {
            logger.warning("some bus messages may not have been sent: a socket was still open at exit")
        }
        logger.info("exited cleanly")
    }
}
