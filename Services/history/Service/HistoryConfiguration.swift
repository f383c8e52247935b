import Foundation
import ServiceKit
import Storage

/// What the history service reads beyond every service's settings.
public struct HistoryConfiguration: Sendable {
    /// The database file (`HISTORY_DB`, default `$DATA_DIR/history.sqlite`).
    public var databasePath: String
    /// PostgreSQL instead of the file (`HISTORY_DATABASE_URL`, `postgres://user:password@host:port/db`):
    /// any number of history replicas then serve the same users.
    public var databaseURL: PostgresLocation?
    /// The most connections history's pool opens to PostgreSQL (`HISTORY_DATABASE_CONNECTIONS`,
    /// default twice this machine's cores, at least 4 and at most 20). History's reads are single
    /// statements of a fraction of a millisecond; more of them at once than the server has cores
    /// only wait for each other inside it. With 20 connections on this 2-core machine, under
    /// `make bench-history STORE=postgres`, a first page's statement took 1.5 to 2.5 ms on
    /// average inside PostgreSQL and up to 670 ms (its backends descheduled while holding the
    /// same hot pages' locks), and p99 was 250 to 380 ms; with 4, 0.2 ms on average, p99 21 to
    /// 26 ms, at the same throughput or more.
    public var databaseConnections: Int
    /// The jobs service, asked to purge deleted items' jobs (`JOBS_ENDPOINT`).
    public var jobsEndpoint: String
    /// The quota service, asked for each user's plan retention (`QUOTA_ENDPOINT`).
    public var quotaEndpoint: String
    /// How often retention sweeps (`HISTORY_SWEEP_MS`, default one hour).
    public var sweepInterval: Duration
    /// How long deletions stay in the changes feed (`HISTORY_CHANGES_KEEP_S`, default 30 days);
    /// an older token answers 410.
    public var changesKeep: Duration

    /// Reads the configuration; `dataDirectory` is the service's `DATA_DIR`.
    public init(environment: Environment, dataDirectory: String) throws {
        databasePath = environment.string("HISTORY_DB", default: dataDirectory + "/history.sqlite")
        databaseURL = try environment.optional("HISTORY_DATABASE_URL").map { try PostgresLocation(variable: "HISTORY_DATABASE_URL", url: $0) }
        databaseConnections = try environment.int("HISTORY_DATABASE_CONNECTIONS", default: Self.defaultConnections)
        guard databaseConnections >= 1 else {
            throw ConfigurationError(key: "HISTORY_DATABASE_CONNECTIONS", value: "\(databaseConnections)", expected: "a number of connections, at least 1")
        }
        jobsEndpoint = environment.string(ServiceName.jobs.endpointVariable, default: ServiceName.jobs.defaultEndpoint)
        quotaEndpoint = environment.string(ServiceName.quota.endpointVariable, default: ServiceName.quota.defaultEndpoint)
        sweepInterval = .milliseconds(max(10, try environment.int("HISTORY_SWEEP_MS", default: 3_600_000)))
        changesKeep = .seconds(max(1, try environment.int("HISTORY_CHANGES_KEEP_S", default: 30 * 86_400)))
    }

    /// `databaseConnections`' default: twice the cores, at least 4, at most 20.
    public static var defaultConnections: Int { min(20, max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)) }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = [
        "HISTORY_DB", "HISTORY_DATABASE_URL", "HISTORY_DATABASE_CONNECTIONS", "JOBS_ENDPOINT", "QUOTA_ENDPOINT", "HISTORY_SWEEP_MS", "HISTORY_CHANGES_KEEP_S",
    ]
}
