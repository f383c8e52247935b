import GatewayApp
import Logging
import NIOCore
import NIOPosix
import ServiceKit
import ServiceLifecycle

// Variables given as files (NAME_FILE), read on the main thread before any task runs.
let files = Environment.loadFiles()

// The gateway: REST for the app, turned into bus requests.
// Before any task starts, with GATEWAY_TASKS_ON_EVENT_LOOPS=true: Swift's tasks run on the event
// loops that serve HTTP (the ones Hummingbird uses), so a request's handler, its bus calls and its
// answer stay on the loop that read it (`EventLoopLane`). Off by default (docs/bus.md).
let tasksOnEventLoops = (try? GatewayConfiguration(environment: Environment()))?.tasksOnEventLoops ?? false
    && NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
await ProcessExit.run("gateway", files: files) {
    let configuration = try GatewayConfiguration(environment: Environment())
    ProcessLogging.bootstrap(level: configuration.logLevel, process: "gateway", format: configuration.logFormat)
    let logger = Logger(label: "gateway")
    let openFiles = ProcessLimits.raiseOpenFiles()
    ProcessMetrics.bootstrap()
    // The disk the gateway fills: the blob folder (an object store's is not the gateway's).
    if case .folder(let folder) = configuration.blobs.store { ProcessMetrics.watchDisk(path: folder.path) }
    let tracing = try ProcessTracing.bootstrap(service: "gateway", logger: logger)
    let app = try await buildApplication(
        configuration: configuration, metrics: ProcessMetrics.registry, logger: logger, firstServices: tracing.map { [$0] } ?? [],
        eventLoops: tasksOnEventLoops ? MultiThreadedEventLoopGroup.singleton : nil
    )
    logger.info("gateway listening", metadata: ["url": "http://\(configuration.host):\(configuration.port)", "open-files": "\(openFiles)"])
    try await ServiceGroup(configuration: .init(named: [app], logger: logger)).run()
}
