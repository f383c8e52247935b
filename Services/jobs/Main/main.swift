import Blobs
import Bus
import Foundation
import JobsCore
import JobsService
import Logging
import ServiceKit
import ServiceLifecycle
import Storage

// Variables given as files (NAME_FILE), read on the main thread before any task runs.
let files = Environment.loadFiles()

// The jobs service: the job queue and lifecycle in $DATA_DIR/jobs.sqlite (or on PostgreSQL,
// JOBS_DATABASE_URL, for replicas of which one, elected, dispatches); workers connect to
// JOBS_WORKER_BIND; quota settlements and history's job events leave through the outbox; purged
// jobs' files are deleted from the blob store, whose presigned URLs the workers are given.
await ProcessExit.run("jobs", files: files) { try await BusServiceRunner.run(.jobs, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try JobsConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let catalog = EffectCatalog(extra: configuration.extraEffects)
    let blobs = try await configuration.blobs.open()
    try BusSecurity.checkExposure(
        configuration.workerEndpoint, variable: "JOBS_WORKER_BIND", curve: service.curveSecretKey != nil,
        knownCallers: service.knownCallers != nil, environment: Environment()
    )
    let transfers = TransferSigner(
        blobs: blobs, lifetime: configuration.transferLifetime,
        webhooks: WebhookSigner(secret: configuration.blobs.urlSigningSecret, publicBaseURL: configuration.blobs.publicBaseURL)
    )
    // A dispatcher on its channel to the workers, writing through `store`.
    let makeDispatcher = { @Sendable (store: any JobsStore) -> (Dispatcher, BusChannel) in
        let channel = BusChannel.binding(
            configuration.workerEndpoint, curveSecretKey: service.curveSecretKey, knownCallers: service.knownCallers != nil,
            encoding: service.busEncoding, logger: logger
        )
        let dispatcher = Dispatcher(
            channel: channel, store: store, catalog: catalog, transfers: transfers, proFirst: configuration.proFirst,
            providerLimits: configuration.providerLimits, lostWorkerGrace: configuration.lostWorkerGrace, logger: logger
        )
        return (dispatcher, channel)
    }
    // Listed before the relays that call through them, so that they stop after them.
    let quota = BusClient(configuration: service.client(of: configuration.quotaEndpoint), logger: logger)
    let history = BusClient(configuration: service.client(of: configuration.historyEndpoint), logger: logger)
    let store: any JobsStore
    let dispatch: any JobDispatch
    /// The dispatcher this replica runs now, if it runs one (on PostgreSQL, only while it leads).
    let localDispatcher: @Sendable () async -> Dispatcher?
    var services: [any Service] = []
    var relays: [any Service] = []
    // Push notifications (off unless APNs or FCM is configured): the sender's HTTP client closes
    // after the relay that sends through it has stopped.
    let sender = configuration.push.platforms.isEmpty ? nil : try await PushSender(settings: configuration.push, logger: logger)
    if let sender {
        relays.append(ClosedAtShutdown(sender.shutdown))
        logger.info("push notifications on", metadata: ["platforms": "\(configuration.push.platforms.map(\.rawValue).joined(separator: ", "))"])
    }
    if let location = configuration.databaseURL {
        // PostgreSQL: any number of replicas over one database, one of them (elected) dispatching.
        try await PostgresPool.migrate(location, service: "jobs", PostgresJobsStore.migrations, logger: logger)
        let database = PostgresPool(location: location, logger: logger)
        let postgres = PostgresJobsStore(
            database: database, retry: configuration.retry, effectTitles: catalog.effects.mapValues(\.title),
            pushPlatforms: configuration.push.platforms, logger: logger
        )
        let link = ReplicatedDispatch(database: database, logger: logger)
        store = postgres
        dispatch = link
        localDispatcher = { link.dispatcher }
        services = [database, quota, history]
        services.append(DispatchLeadership(election: DispatchElection(database: database, logger: logger), store: postgres, link: link, logger: logger) {
            makeDispatcher($0)
        })
        relays += [
            JobsRelays.settlements(outbox: PostgresJobsOutbox(store: postgres, topic: OutboxEntry.Topic.quota), quota: quota, logger: logger),
            JobsRelays.historyEvents(outbox: PostgresJobsHistoryFeed(store: postgres), history: history, logger: logger),
            JobsRelays.fileDeletions(outbox: PostgresJobsOutbox(store: postgres, topic: OutboxEntry.Topic.blobs), blobs: blobs, logger: logger),
        ]
        if let sender {
            relays.append(JobsRelays.notifications(outbox: PostgresJobsOutbox(store: postgres, topic: OutboxEntry.Topic.push), sender: sender, store: postgres, logger: logger))
        }
        ProcessMetrics.addReporter { await link.dispatcher?.workerSections() ?? [] }
        logger.info("jobs database open", metadata: ["postgres": "\(location)"])
    } else {
        let database = try JobsDatabase.open(path: configuration.databasePath)
        let sqlite = SQLiteJobsStore(
            database: database, retry: configuration.retry, effectTitles: catalog.effects.mapValues(\.title), pushPlatforms: configuration.push.platforms
        )
        let (dispatcher, channel) = makeDispatcher(sqlite)
        await dispatcher.apply(try await sqlite.dispatchControls())
        await dispatcher.load(try await sqlite.recover(now: Date()))
        store = sqlite
        dispatch = dispatcher
        localDispatcher = { dispatcher }
        // The database first: it closes after everything that writes through it has stopped.
        services = [ClosedAtShutdown(database.close), quota, history, DispatcherService(dispatcher: dispatcher, channel: channel)]
        relays += [
            JobsRelays.settlements(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.quota), quota: quota, logger: logger),
            JobsRelays.historyEvents(outbox: JobsHistoryFeed(store: sqlite), history: history, logger: logger),
            JobsRelays.fileDeletions(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.blobs), blobs: blobs, logger: logger),
        ]
        if let sender {
            relays.append(JobsRelays.notifications(outbox: JobsOutbox(database: database, topic: OutboxEntry.Topic.push), sender: sender, store: sqlite, logger: logger))
        }
        ProcessMetrics.addReporter { await dispatcher.workerSections() }
        logger.info("jobs database open", metadata: ["path": "\(configuration.databasePath)"])
    }
    ProcessMetrics.onScrape {
        guard let counts = try? await store.counts() else { return }
        let dispatcher = await localDispatcher()
        JobsMetrics.refresh(
            states: counts.states, outbox: counts.outbox, queued: await dispatch.queuedCount, awaiting: await dispatcher?.awaitingCount ?? 0,
            slotsHeld: await dispatcher?.slotsHeld ?? 0, oldestQueuedAge: counts.oldestQueued.map { max(0, Date().timeIntervalSince($0)) } ?? 0
        )
    }
    JobsMetrics.prepare(catalog: catalog)
    JobsHandler(
        store: store, dispatcher: dispatch, catalog: catalog, maxQueued: configuration.maxQueued, quota: quota, retryAttempts: configuration.retry.maxAttempts
    ).register(on: &router)
    logger.info("jobs ready", metadata: ["workers": "\(configuration.workerEndpoint)", "blobs": "\(blobs.kind)"])
    return services + relays + [
        UnusedUploadSweeper(
            blobs: blobs, store: store, age: TimeInterval(configuration.unusedUploadAge), interval: configuration.uploadSweepInterval, logger: logger
        ),
    ]
}
}
