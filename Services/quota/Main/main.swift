import Bus
import Foundation
import QuotaService
import ServiceKit
import Storage

// The quota service: plans, usage windows, and the ledger of charges, in $DATA_DIR/quota.sqlite.
await ProcessExit.run("quota") { try await BusServiceRunner.run(.quota, translateErrors: StorageFailure.translator) { router, service, logger in
    let configuration = try QuotaConfiguration(environment: Environment(), dataDirectory: service.dataDirectory)
    try FileManager.default.createDirectory(atPath: service.dataDirectory, withIntermediateDirectories: true)
    let store = try QuotaDatabase.open(path: configuration.databasePath, plans: configuration.plans, guests: configuration.guests)
    QuotaHandler(store: store, plans: configuration.plans).register(on: &router)
    logger.info("quota database open", metadata: [
        "path": "\(configuration.databasePath)",
        "plans": "\(configuration.plans.plans.keys.sorted().joined(separator: ","))",
    ])
    // Listed before the resolver that calls through it, so that it stops after it.
    let jobs = BusClient(configuration: service.client(of: configuration.jobsEndpoint), logger: logger)
    return [
        jobs,
        StaleReservationResolver(
            store: store, jobs: jobs, staleAfter: configuration.staleAfter, interval: configuration.staleScanInterval, logger: logger
        ),
    ]
}
}
