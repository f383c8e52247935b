import Bus
import Foundation
import Messages
import Metrics
import QuotaCore
import Storage

/// The quota service's bus methods: each write runs the ledger operation in a group-committed
/// transaction and answers once that transaction is durable; reads run on a reader connection.
public struct QuotaHandler: Sendable {
    let ledger: QuotaLedger
    let database: QuotaDatabase
    let committer: GroupCommitter
    let now: @Sendable () -> Date

    let plans: PlanCatalog

    public init(database: QuotaDatabase, plans: PlanCatalog, guests: GuestLimits = GuestLimits(), now: @escaping @Sendable () -> Date = Date.init) {
        self.ledger = QuotaLedger(plans: plans, guests: guests)
        self.plans = plans
        self.database = database
        self.committer = GroupCommitter(writer: database.writer)
        self.now = now
    }

    /// Counts a decision in `quota_decisions_total`, by window: an admission in each window the
    /// plan limits, a denial in each window that refused.
    static func count(_ decision: QuotaDecision) {
        if decision.admitted {
            for window in [decision.status.daily, decision.status.monthly] where window.limit != nil {
                decisionCounters[DecisionKey(admitted: true, window: window.name)]?.increment()
            }
        } else {
            for window in decision.violated {
                decisionCounters[DecisionKey(admitted: false, window: window)]?.increment()
            }
        }
    }

    private struct DecisionKey: Hashable {
        var admitted: Bool
        var window: String
    }

    /// The four series, made once (making a handle is a registry lookup under a lock).
    private static let decisionCounters: [DecisionKey: Counter] = {
        var counters: [DecisionKey: Counter] = [:]
        for admitted in [true, false] {
            for window in [CalendarWindow.Kind.daily.rawValue, CalendarWindow.Kind.monthly.rawValue, "network"] {
                counters[DecisionKey(admitted: admitted, window: window)] = Counter(
                    label: "quota_decisions_total", dimensions: [("decision", admitted ? "admitted" : "denied"), ("window", window)]
                )
            }
        }
        return counters
    }()

    /// Registers every quota method on `router`.
    public func register(on router: inout BusRouter) {
        router.register(Quota.reserve) { request, _ in
            let now = now()
            let decision = try await committer.perform { [ledger] db in try ledger.reserve(db, request, now: now) }
            Self.count(decision)
            return decision
        }
        router.register(Quota.commit) { request, _ in
            let now = now()
            return try await committer.perform { [ledger] db in try ledger.commit(db, jobId: request.jobId, now: now) }
        }
        router.register(Quota.release) { request, _ in
            let now = now()
            return try await committer.perform { [ledger] db in try ledger.release(db, jobId: request.jobId, now: now) }
        }
        router.register(Quota.status) { request, _ in
            let now = now()
            return try await database.writer.read { [ledger] db in try ledger.status(db, user: request.userId, now: now) }
        }
        router.register(Quota.setPlan) { request, _ in
            let now = now()
            return try await committer.perform { [ledger] db in try ledger.setPlan(db, request, now: now) }
        }
        router.register(Quota.applySubscription) { request, _ in
            let now = now()
            return try await committer.perform { [ledger] db in try ledger.applySubscription(db, request, now: now) }
        }
        router.register(Quota.admitGuest) { request, _ in
            let now = now()
            let admission = try await committer.perform { [ledger] db in try ledger.admitGuest(db, request, now: now) }
            if !admission.admitted { Counter(label: "quota_guests_refused_total").increment() }
            return admission
        }
        router.register(Quota.attestGuest) { request, _ in
            let now = now()
            return try await committer.perform { [ledger] db in try ledger.attestGuest(db, request, now: now) }
        }
        router.register(Quota.plans) { _, _ in
            plans.plans.values.sorted { $0.name < $1.name }.map {
                PlanDescription(name: $0.name, dailyLimit: $0.dailyLimit, monthlyLimit: $0.monthlyLimit, isPro: $0.isPro, retentionDays: $0.retentionDays)
            }
        }
        router.register(Quota.usage) { request, _ in
            let now = now()
            return try await database.writer.read { [ledger] db in try ledger.usage(db, user: request.userId, now: now) }
        }
    }
}
