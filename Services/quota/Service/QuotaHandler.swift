import Bus
import Foundation
import Messages
import Metrics
import QuotaCore

/// The quota service's bus methods: each one call of the store (`QuotaStore`), whose writes are
/// durable before they answer.
public struct QuotaHandler: Sendable {
    let store: any QuotaStore
    let plans: PlanCatalog
    let now: @Sendable () -> Date
    /// How long a settled charge is remembered (`IDEMPOTENCY_WINDOW_S`), told with each decision
    /// so that the gateway refuses keys by quota's window, whatever its own is set to.
    let idempotencyWindow: Duration?

    public init(store: any QuotaStore, plans: PlanCatalog, idempotencyWindow: Duration? = nil, now: @escaping @Sendable () -> Date = Date.init) {
        self.store = store
        self.plans = plans
        self.idempotencyWindow = idempotencyWindow
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

    static let guestsRefused = Counter(label: "quota_guests_refused_total")

    /// The six series, made once (making a handle is a registry lookup under a lock).
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

    /// Registers every quota method on `router`, and makes its metrics' series at zero.
    public func register(on router: inout BusRouter) {
        _ = Self.decisionCounters
        _ = Self.guestsRefused
        router.register(Quota.reserve) { request, _ in
            var decision = try await store.reserve(request, now: now())
            Self.count(decision)
            decision.idempotencyWindow = idempotencyWindow.map { Int($0.components.seconds) }
            return decision
        }
        router.register(Quota.commit) { request, _ in try await store.commit(jobId: request.jobId, now: now()) }
        router.register(Quota.release) { request, _ in try await store.release(jobId: request.jobId, now: now()) }
        router.register(Quota.status) { request, _ in try await store.status(userId: request.userId, now: now()) }
        router.register(Quota.setPlan) { request, _ in try await store.setPlan(request, now: now()) }
        router.register(Quota.adjust) { request, _ in try await store.adjust(request, now: now()) }
        router.register(Quota.applySubscription) { request, _ in try await store.applySubscription(request, now: now()) }
        router.register(Quota.admitGuest) { request, _ in
            let admission = try await store.admitGuest(request, now: now())
            if !admission.admitted { Self.guestsRefused.increment() }
            return admission
        }
        router.register(Quota.attestGuest) { request, _ in try await store.attestGuest(request, now: now()) }
        router.register(Quota.plans) { _, _ in
            plans.plans.values.sorted { $0.name < $1.name }.map {
                PlanDescription(name: $0.name, dailyLimit: $0.dailyLimit, monthlyLimit: $0.monthlyLimit, isPro: $0.isPro, retentionDays: $0.retentionDays)
            }
        }
        router.register(Quota.usage) { request, _ in try await store.usage(userId: request.userId, now: now()) }
    }
}
