import GatewayApp
import Logging
import ServiceKit

// The gateway: REST for the app, turned into bus requests.
await ProcessExit.run("gateway") {
    let configuration = try GatewayConfiguration(environment: Environment())
    ProcessLogging.bootstrap(level: configuration.logLevel, process: "gateway", format: configuration.logFormat)
    let logger = Logger(label: "gateway")
    let openFiles = ProcessLimits.raiseOpenFiles()
    ProcessMetrics.bootstrap()
    // The disk the gateway fills: the blob folder (an object store's is not the gateway's).
    if case .folder(let folder) = configuration.blobs.store { ProcessMetrics.watchDisk(path: folder.path) }
    let tracing = try ProcessTracing.bootstrap(service: "gateway", logger: logger)
    let app = try await buildApplication(
        configuration: configuration, metrics: ProcessMetrics.registry, logger: logger, firstServices: tracing.map { [$0] } ?? []
    )
    logger.info("gateway listening", metadata: ["url": "http://\(configuration.host):\(configuration.port)", "open-files": "\(openFiles)"])
    try await app.runService()
}
