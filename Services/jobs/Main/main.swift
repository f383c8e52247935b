import Blobs
import Bus
import Foundation
import JobsCore
import JobsService
import Logging
import ServiceKit
import Storage

// The jobs service: the job queue and lifecycle in $DATA_DIR/jobs.sqlite; workers connect to
// JOBS_WORKER_BIND; quota settlements and history's job events leave through the outbox; purged
// jobs' files are deleted from the blob store, whose presigned URLs the workers are given.
await ProcessExit.run("jobs") { try await BusServiceRunner.run(.jobs, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try JobsConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let database = try JobsDatabase.open(path: configuration.databasePath)
    let catalog = EffectCatalog(extra: configuration.extraEffects)
    let store = SQLiteJobsStore(database: database, retry: configuration.retry, effectTitles: catalog.effects.mapValues(\.title))
    let blobs = try await configuration.blobs.open()
    try BusSecurity.checkExposure(configuration.workerEndpoint, variable: "JOBS_WORKER_BIND", curve: service.curveSecretKey != nil, environment: Environment())
    let channel = BusChannel.binding(
        configuration.workerEndpoint, curveSecretKey: service.curveSecretKey, knownCallers: service.knownCallers != nil,
        encoding: service.busEncoding, logger: logger
    )
    let dispatcher = Dispatcher(
        channel: channel, store: store, catalog: catalog,
        transfers: TransferSigner(
            blobs: blobs, lifetime: configuration.transferLifetime,
            webhooks: WebhookSigner(secret: configuration.blobs.urlSigningSecret, publicBaseURL: configuration.blobs.publicBaseURL)
        ),
        proFirst: configuration.proFirst, providerLimits: configuration.providerLimits, logger: logger
    )
    let recovered = try await store.recover(now: Date())
    await dispatcher.load(recovered)
    ProcessMetrics.onScrape {
        guard let counts = try? await store.counts() else { return }
        JobsMetrics.refresh(states: counts.states, outbox: counts.outbox, queued: await dispatcher.queuedCount, awaiting: await dispatcher.awaitingCount, slotsHeld: await dispatcher.slotsHeld)
    }
    ProcessMetrics.addReporter { await dispatcher.workerSections() }
    JobsHandler(store: store, dispatcher: dispatcher, catalog: catalog, maxQueued: configuration.maxQueued).register(on: &router)
    logger.info("jobs ready", metadata: ["workers": "\(configuration.workerEndpoint)", "queued": "\(recovered.count)", "blobs": "\(blobs.kind)"])
    // Listed before the relays that call through them, so that they stop after them.
    let quota = BusClient(configuration: service.client(of: configuration.quotaEndpoint), logger: logger)
    let history = BusClient(configuration: service.client(of: configuration.historyEndpoint), logger: logger)
    return [
        quota,
        history,
        DispatcherService(dispatcher: dispatcher, channel: channel),
        JobsRelays.settlements(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.quota), quota: quota, logger: logger),
        JobsRelays.historyEvents(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.history), history: history, logger: logger),
        JobsRelays.fileDeletions(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.blobs), blobs: blobs, logger: logger),
        UnusedUploadSweeper(
            blobs: blobs, store: store, age: TimeInterval(configuration.unusedUploadAge), interval: configuration.uploadSweepInterval, logger: logger
        ),
    ]
}
}
