import Foundation
import ServiceKit

/// What the history service reads beyond every service's settings.
public struct HistoryConfiguration: Sendable {
    /// The database file (`HISTORY_DB`, default `$DATA_DIR/history.sqlite`).
    public var databasePath: String
    /// The jobs service, asked to purge deleted items' jobs (`JOBS_ENDPOINT`).
    public var jobsEndpoint: String
    /// The quota service, asked for each user's plan retention (`QUOTA_ENDPOINT`).
    public var quotaEndpoint: String
    /// How often retention sweeps (`HISTORY_SWEEP_MS`, default one hour).
    public var sweepInterval: Duration
    /// How long deletions stay in the changes feed (`HISTORY_CHANGES_KEEP_S`, default 30 days);
    /// an older token answers 410.
    public var changesKeep: Duration

    public init(
        databasePath: String, jobsEndpoint: String = ServiceName.jobs.defaultEndpoint, quotaEndpoint: String = ServiceName.quota.defaultEndpoint,
        sweepInterval: Duration = .seconds(3600), changesKeep: Duration = .seconds(30 * 86_400)
    ) {
        self.databasePath = databasePath
        self.jobsEndpoint = jobsEndpoint
        self.quotaEndpoint = quotaEndpoint
        self.sweepInterval = sweepInterval
        self.changesKeep = changesKeep
    }

    /// Reads the configuration; `dataDirectory` is the service's `DATA_DIR`.
    public init(environment: Environment, dataDirectory: String) throws {
        self.init(
            databasePath: environment.string("HISTORY_DB", default: dataDirectory + "/history.sqlite"),
            jobsEndpoint: environment.string(ServiceName.jobs.endpointVariable, default: ServiceName.jobs.defaultEndpoint),
            quotaEndpoint: environment.string(ServiceName.quota.endpointVariable, default: ServiceName.quota.defaultEndpoint),
            sweepInterval: .milliseconds(max(10, try environment.int("HISTORY_SWEEP_MS", default: 3_600_000))),
            changesKeep: .seconds(max(1, try environment.int("HISTORY_CHANGES_KEEP_S", default: 30 * 86_400)))
        )
    }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = ["HISTORY_DB", "JOBS_ENDPOINT", "QUOTA_ENDPOINT", "HISTORY_SWEEP_MS", "HISTORY_CHANGES_KEEP_S"]
}
