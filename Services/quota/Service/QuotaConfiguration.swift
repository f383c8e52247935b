import Foundation
import QuotaCore
import ServiceKit
import Storage

/// What the quota service reads from the environment beyond every service's settings.
public struct QuotaConfiguration: Sendable {
    /// The plans (`QUOTA_PLANS`, JSON; default free 20/day 600/month, pro 500/day).
    public var plans: PlanCatalog
    /// The database file (`QUOTA_DB`, default `$DATA_DIR/quota.sqlite`).
    public var databasePath: String
    /// PostgreSQL instead of the file (`QUOTA_DATABASE_URL`, `postgres://user:password@host:port/db`):
    /// any number of quota replicas then serve the same users.
    public var databaseURL: PostgresLocation?

    /// When an unconfirmed reservation counts as stale (`QUOTA_STALE_AFTER_S`, default 120) and
    /// how often they are looked for (`QUOTA_STALE_SCAN_MS`, default 10000).
    public var staleAfter: Duration
    public var staleScanInterval: Duration
    /// The jobs service, asked about stale reservations (`JOBS_ENDPOINT`).
    public var jobsEndpoint: String
    /// New guests a client network may make an hour (`QUOTA_GUESTS_PER_NETWORK_HOUR`, 30) and
    /// the credits its guests share a day (`QUOTA_GUEST_NETWORK_DAILY`, 100; 0: none shared).
    public var guests: GuestLimits
    /// How long a settled charge's job id is remembered (`IDEMPOTENCY_WINDOW_S`, default 86400:
    /// a day, as Stripe keeps idempotency keys); the gateway refuses a job id older than that.
    public var idempotencyWindow: Duration

    /// Reads the configuration; `dataDirectory` is the service's `DATA_DIR`.
    public init(environment: Environment, dataDirectory: String) throws {
        var plans = PlanCatalog.standard
        if let json = environment.optional("QUOTA_PLANS") {
            do {
                plans = try PlanCatalog.parse(json: json)
            } catch {
                throw ConfigurationError(key: "QUOTA_PLANS", value: json, expected: "a JSON plan catalogue (\(error))")
            }
        }
        self.plans = plans
        databasePath = environment.string("QUOTA_DB", default: dataDirectory + "/quota.sqlite")
        staleAfter = .seconds(try environment.int("QUOTA_STALE_AFTER_S", default: 120))
        staleScanInterval = .milliseconds(max(10, try environment.int("QUOTA_STALE_SCAN_MS", default: 10_000)))
        jobsEndpoint = environment.string(ServiceName.jobs.endpointVariable, default: ServiceName.jobs.defaultEndpoint)
        databaseURL = try environment.optional("QUOTA_DATABASE_URL").map { try PostgresLocation(variable: "QUOTA_DATABASE_URL", url: $0) }
        idempotencyWindow = .seconds(max(1, try environment.int("IDEMPOTENCY_WINDOW_S", default: 86_400)))
        guests = GuestLimits(
            perNetworkHour: max(0, try environment.int("QUOTA_GUESTS_PER_NETWORK_HOUR", default: 30)),
            networkDaily: max(0, try environment.int("QUOTA_GUEST_NETWORK_DAILY", default: 100))
        )
    }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = ["QUOTA_PLANS", "QUOTA_DB", "QUOTA_STALE_AFTER_S", "QUOTA_STALE_SCAN_MS", "JOBS_ENDPOINT",
                                         "QUOTA_GUESTS_PER_NETWORK_HOUR", "QUOTA_GUEST_NETWORK_DAILY", "QUOTA_DATABASE_URL",
                                         "IDEMPOTENCY_WINDOW_S"]
}
