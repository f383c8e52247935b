import Bus
import Foundation
import QuotaService
import ServiceKit
import ServiceLifecycle
import Storage

// Variables given as files (NAME_FILE), read on the main thread before any task runs.
let files = Environment.loadFiles()

// The quota service: plans, usage windows, and the ledger of charges, in $DATA_DIR/quota.sqlite.
await ProcessExit.run("quota", files: files) { try await BusServiceRunner.run(.quota, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try QuotaConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let store: any QuotaStore
    var storage: [any Service] = []
    if let location = configuration.databaseURL {
        // PostgreSQL: any number of replicas over one database; migrated once at start.
        try await PostgresPool.migrate(location, service: "quota", PostgresQuotaStore.migrations, logger: logger)
        let database = PostgresPool(location: location, logger: logger)
        storage.append(database)
        store = PostgresQuotaStore(database: database, plans: configuration.plans, guests: configuration.guests, logger: logger)
        logger.info("quota database open", metadata: ["postgres": "\(location)"])
    } else {
        let database = try QuotaDatabase.open(path: configuration.databasePath, plans: configuration.plans, guests: configuration.guests, logger: logger)
        store = database
        // Listed first: it closes after everything that writes through it has stopped.
        storage.append(ClosedAtShutdown(database.close))
        logger.info("quota database open", metadata: ["path": "\(configuration.databasePath)"])
    }
    QuotaHandler(store: store, plans: configuration.plans, idempotencyWindow: configuration.idempotencyWindow).register(on: &router)
    logger.info("quota plans", metadata: ["plans": "\(configuration.plans.plans.keys.sorted().joined(separator: ","))"])
    // Listed before the resolver that calls through it, so that it stops after it.
    let jobs = BusClient(configuration: service.client(of: configuration.jobsEndpoint), logger: logger)
    return storage + [
        jobs,
        StaleReservationResolver(
            store: store, jobs: jobs, staleAfter: configuration.staleAfter, interval: configuration.staleScanInterval, logger: logger
        ),
        ChargeForgetter(store: store, window: configuration.idempotencyWindow, logger: logger),
    ]
}
}
