import Foundation
import QuotaCore
import ServiceKit

/// What the quota service reads from the environment beyond every service's settings.
public struct QuotaConfiguration: Sendable {
    /// The plans (`QUOTA_PLANS`, JSON; default free 20/day 600/month, pro 500/day).
    public var plans: PlanCatalog
    /// The database file (`QUOTA_DB`, default `$DATA_DIR/quota.sqlite`).
    public var databasePath: String

    public init(plans: PlanCatalog = .standard, databasePath: String) {
        self.plans = plans
        self.databasePath = databasePath
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
            databasePath: environment.string("QUOTA_DB", default: dataDirectory + "/quota.sqlite")
        )
    }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = ["QUOTA_PLANS", "QUOTA_DB"]
}
