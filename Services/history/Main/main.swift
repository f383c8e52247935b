import Bus
import Foundation
import HistoryService
import Logging
import ServiceKit
import Storage

// The history service: the read model of users' past edits in $DATA_DIR/history.sqlite, fed by
// job events from jobs; deletes purge jobs through jobs; retention asks quota for each plan's.
await ProcessExit.run("history") { try await BusServiceRunner.run(.history, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try HistoryConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let database = try HistoryDatabase.open(path: configuration.databasePath)
    // Listed before the services that call through them, so that they stop after them.
    let jobs = BusClient(configuration: service.client(of: configuration.jobsEndpoint), logger: logger)
    let quota = BusClient(configuration: service.client(of: configuration.quotaEndpoint), logger: logger)
    let purges = HistoryRelays.purges(database: database, jobs: jobs, logger: logger)
    HistoryHandler(store: database, purges: purges).register(on: &router)
    let pending = try await database.pendingPurgeCount()
    logger.info("history ready", metadata: ["pendingPurges": "\(pending)"])
    return [
        jobs,
        quota,
        purges,
        RetentionSweeper(
            store: database, quota: quota, interval: configuration.sweepInterval, changesKeep: configuration.changesKeep, purges: purges, logger: logger
        ),
    ]
}
}
