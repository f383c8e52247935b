import Foundation

/// A plan's limits: units a calendar day and a calendar month, nil where the plan has none.
public struct Plan: Codable, Sendable, Equatable {
    public var name: String
    public var dailyLimit: Int?
    public var monthlyLimit: Int?
    /// Whether the plan is a paid ("PRO") one, as the app shows it.
    public var isPro: Bool
    /// Days a user's history items are kept (30 on free, 365 on pro by default).
    public var retentionDays: Int

    public init(name: String, dailyLimit: Int?, monthlyLimit: Int?, isPro: Bool, retentionDays: Int? = nil) {
        self.name = name
        self.dailyLimit = dailyLimit
        self.monthlyLimit = monthlyLimit
        self.isPro = isPro
        self.retentionDays = retentionDays ?? (isPro ? 365 : 30)
    }
}

/// The plans this deployment offers, and the one unknown users are on.
public struct PlanCatalog: Sendable, Equatable {
    public private(set) var plans: [String: Plan]
    public let defaultPlan: String

    /// Free: 20 a day and 600 a month, hard. Pro: no monthly limit, 500 a day as fair use.
    public static let standard = PlanCatalog(plans: [
        Plan(name: "free", dailyLimit: 20, monthlyLimit: 600, isPro: false),
        Plan(name: "pro", dailyLimit: 500, monthlyLimit: nil, isPro: true),
    ], defaultPlan: "free")

    public init(plans: [Plan], defaultPlan: String) {
        self.plans = Dictionary(plans.map { ($0.name, $0) }, uniquingKeysWith: { _, last in last })
        self.defaultPlan = defaultPlan
        precondition(self.plans[defaultPlan] != nil, "the default plan must be in the catalogue")
    }

    /// The plan named `name`, nil if there is none.
    public func plan(named name: String) -> Plan? { plans[name] }

    /// The plan a user on `name` gets: that plan, or the default if it has left the catalogue.
    public func effectivePlan(_ name: String?) -> Plan {
        name.flatMap { plans[$0] } ?? plans[defaultPlan]!
    }

    /// Reads a catalogue from JSON such as
    /// `{"free": {"daily": 20, "monthly": 600}, "pro": {"daily": 500, "isPro": true, "retentionDays": 365}}`;
    /// `free` (or the first name in order) is the default plan; `retentionDays` defaults to 365
    /// for PRO plans and 30 for the others.
    public static func parse(json: String) throws -> PlanCatalog {
        struct Entry: Decodable {
            var daily: Int?
            var monthly: Int?
            var isPro: Bool?
            var retentionDays: Int?
        }
        let entries = try JSONDecoder().decode([String: Entry].self, from: Data(json.utf8))
        guard !entries.isEmpty else { throw PlanCatalogError("no plans") }
        for (name, entry) in entries {
            if let daily = entry.daily, daily < 0 { throw PlanCatalogError("\(name): negative daily limit") }
            if let monthly = entry.monthly, monthly < 0 { throw PlanCatalogError("\(name): negative monthly limit") }
            if let days = entry.retentionDays, days < 1 { throw PlanCatalogError("\(name): retentionDays must be at least 1") }
        }
        let plans = entries.map { Plan(name: $0.key, dailyLimit: $0.value.daily, monthlyLimit: $0.value.monthly, isPro: $0.value.isPro ?? ($0.key == "pro"), retentionDays: $0.value.retentionDays) }
        return PlanCatalog(plans: plans, defaultPlan: entries["free"] != nil ? "free" : entries.keys.sorted()[0])
    }
}

/// A plan catalogue that cannot be used.
public struct PlanCatalogError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// What guests (users known only by a device id) may do per client network: make at most
/// `perNetworkHour` new guest ids an hour (0: no limit), and spend at most `networkDaily`
/// credits a day between them (0: no shared limit), besides each guest's own plan.
public struct GuestLimits: Sendable, Equatable {
    public var perNetworkHour: Int
    public var networkDaily: Int
    public init(perNetworkHour: Int = 30, networkDaily: Int = 100) {
        self.perNetworkHour = perNetworkHour
        self.networkDaily = networkDaily
    }
}
