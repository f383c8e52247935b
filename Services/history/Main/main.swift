import Bus
import Foundation
import HistoryService
import Logging
import ServiceKit
import ServiceLifecycle
import Storage

// Variables given as files (NAME_FILE), read on the main thread before any task runs.
let files = Environment.loadFiles()

// The history service: the read model of users' past edits in $DATA_DIR/history.sqlite (or on
// PostgreSQL, HISTORY_DATABASE_URL, for replicas), fed by job events from jobs; deletes purge
// jobs through jobs; retention asks quota for each plan's.
await ProcessExit.run("history", files: files) { try await BusServiceRunner.run(.history, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try HistoryConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let store: any HistoryStore
    var storage: [any Service] = []
    if let location = configuration.databaseURL {
        // PostgreSQL: any number of replicas over one database; migrated once at start.
        let key = try await PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { db in
            try await PostgresHistoryStore.tokenKey(db, logger: logger)
        }
        let database = PostgresPool(
            location: location, maximumConnections: configuration.databaseConnections, settings: PostgresHistoryStore.sessionSettings, logger: logger
        )
        storage.append(database)
        store = PostgresHistoryStore(database: database, tokenKey: key, logger: logger)
        logger.info("history database open", metadata: ["postgres": "\(location)"])
    } else {
        let database = try HistoryDatabase.open(path: configuration.databasePath)
        store = database
        // Listed first: it closes after everything that writes through it has stopped.
        storage.append(ClosedAtShutdown(database.close))
        logger.info("history database open", metadata: ["path": "\(configuration.databasePath)"])
    }
    // Listed before the services that call through them, so that they stop after them.
    let jobs = BusClient(configuration: service.client(of: configuration.jobsEndpoint), logger: logger)
    let quota = BusClient(configuration: service.client(of: configuration.quotaEndpoint), logger: logger)
    let purges = HistoryRelays.purges(store: store, jobs: jobs, logger: logger)
    HistoryHandler(store: store, purges: purges).register(on: &router)
    logger.info("history ready")
    return storage + [
        jobs,
        quota,
        purges,
        RetentionSweeper(
            store: store, quota: quota, interval: configuration.sweepInterval, changesKeep: configuration.changesKeep, purges: purges, logger: logger
        ),
    ]
}
}
