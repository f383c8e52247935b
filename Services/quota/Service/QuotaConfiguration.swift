import Foundation
import QuotaCore
import ServiceKit

/// What the quota service reads from the environment beyond every service's settings.
public struct QuotaConfiguration: Sendable {
    /// The plans (`QUOTA_PLANS`, JSON; default free 20/day 600/month, pro 500/day).
    public var plans: PlanCatalog
    /// The database file (`QUOTA_DB`, default `$DATA_DIR/quota.sqlite`).
    public var databasePath: String

    /// When an unconfirmed reservation counts as stale (`QUOTA_STALE_AFTER_S`, default 120) and
    /// how often they are looked for (`QUOTA_STALE_SCAN_MS`, default 10000).
    public var staleAfter: Duration
    public var staleScanInterval: Duration
    /// The jobs service, asked about stale reservations (`JOBS_ENDPOINT`).
    public var jobsEndpoint: String
    /// New guests a client network may make an hour (`QUOTA_GUESTS_PER_NETWORK_HOUR`, 30) and
    /// the credits its guests share a day (`QUOTA_GUEST_NETWORK_DAILY`, 100; 0: none shared).
    public var guests = GuestLimits()

    public init(plans: PlanCatalog = .standard, databasePath: String, staleAfter: Duration = .seconds(120), staleScanInterval: Duration = .seconds(10), jobsEndpoint: String = ServiceName.jobs.defaultEndpoint) {
        self.plans = plans
        self.databasePath = databasePath
        self.staleAfter = staleAfter
        self.staleScanInterval = staleScanInterval
        self.jobsEndpoint = jobsEndpoint
    }

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
        self.init(
            plans: plans,
            databasePath: environment.string("QUOTA_DB", default: dataDirectory + "/quota.sqlite"),
            staleAfter: .seconds(try environment.int("QUOTA_STALE_AFTER_S", default: 120)),
            staleScanInterval: .milliseconds(max(10, try environment.int("QUOTA_STALE_SCAN_MS", default: 10_000))),
            jobsEndpoint: environment.string(ServiceName.jobs.endpointVariable, default: ServiceName.jobs.defaultEndpoint)
        )
        guests = GuestLimits(
            perNetworkHour: max(0, try environment.int("QUOTA_GUESTS_PER_NETWORK_HOUR", default: 30)),
            networkDaily: max(0, try environment.int("QUOTA_GUEST_NETWORK_DAILY", default: 100))
        )
    }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = ["QUOTA_PLANS", "QUOTA_DB", "QUOTA_STALE_AFTER_S", "QUOTA_STALE_SCAN_MS", "JOBS_ENDPOINT",
                                         "QUOTA_GUESTS_PER_NETWORK_HOUR", "QUOTA_GUEST_NETWORK_DAILY"]
}
