import Foundation
import JobsCore
import Logging
import ServiceKit
import ServiceLifecycle
import WorkerKit
import ZeroMQ

// Variables given as files (NAME_FILE), read on the main thread before any task runs.
let files = Environment.loadFiles()

// A worker: runs edits for the jobs service. Start as many as the machine affords.
await ProcessExit.run("worker", files: files) {
    let configuration = try WorkerConfiguration(environment: Environment())
    ProcessLogging.bootstrap(level: configuration.logLevel, process: configuration.workerId, format: configuration.logFormat)
    let logger = Logger(label: configuration.workerId)
    ProcessMetrics.bootstrap()
    EffectRunner.startImageLibrary()
    let scratch = try ScratchFolder.claim(path: configuration.scratchDirectory, logger: logger)
    defer { scratch.release() }
    let runner = EffectRunner(
        scratch: scratch.url, maxPixels: configuration.maxPixels,
        providers: try ProviderSettings(environment: Environment())
    )
    let worker = Worker(
        configuration: configuration, runner: runner,
        effects: configuration.effects,
        logger: logger
    )
    let tracing = try ProcessTracing.bootstrap(service: "worker", instance: configuration.workerId, logger: logger)
    // The exporter first: it stops last, after the worker's spans are recorded.
    let services: [any Service] = (tracing.map { [$0] } ?? []) + [worker]
    let group = ServiceGroup(configuration: .init(named: services, logger: logger))
    try await group.run()
    // Let libzmq send the last reports (a job's `done`) before the process ends with them queued.
    await ZMQContext.shared.terminate(within: .seconds(3))
}
