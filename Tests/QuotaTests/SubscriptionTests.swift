import Foundation
import Messages
import QuotaCore
import QuotaService
import Testing

/// Plans with an end and subscription events, against both implementations of the store.
@Suite("Plans with an end and subscription events", .timeLimit(.minutes(5)))
struct SubscriptionTests {
    let noon = try! Date("2026-11-21T12:00:00Z", strategy: .iso8601)

    func apply(_ q: QuotaStoreHarness, _ id: String, _ user: String, _ effect: SubscriptionEvent.Effect, endsAt: Date? = nil, occurredAt: Date, at now: Date) async throws -> SubscriptionOutcome {
        try await q.store.applySubscription(SubscriptionEvent(
            eventId: id, userId: user, effect: effect, plan: "pro", endsAt: endsAt, occurredAt: occurredAt,
            type: effect == .grant ? "subscription_started" : "subscription_expired"
        ), now: now)
    }

    @Test(arguments: QuotaBackend.allCases) func proEndsAtThePeriodsEndWithNoExpiryEvent(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given a grant until 13:00
            let end = noon.addingTimeInterval(3600)
            #expect(try await apply(q, "e1", "ann", .grant, endsAt: end, occurredAt: noon, at: noon).result == "applied")
            // Then until then the user is PRO, with the end said
            let during = try await q.status("ann", at: end.addingTimeInterval(-1))
            #expect(during.isPro && during.plan == "pro" && during.planEndsAt == end)
            #expect(try await q.reserve("ann", "j1", at: end.addingTimeInterval(-1)).status.isPro)
            // And from the end on, free for every decision, though no expiry event ever came
            let after = try await q.status("ann", at: end)
            #expect(!after.isPro && after.plan == "free" && after.planEndsAt == nil)
            #expect(!(try await q.reserve("ann", "j2", at: end).status.isPro))
        }
    }

    @Test(arguments: QuotaBackend.allCases) func usageCarriesAcrossUpgradeAndDowngradeWithinADayAndIsNeverNegative(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given 20 edits on free today
            for index in 0..<20 { #expect(try await q.reserve("bea", "f\(index)", at: noon).admitted) }
            #expect(!(try await q.reserve("bea", "f20", at: noon).admitted))
            // When she upgrades, she has 480 of PRO's 500 left today
            _ = try await apply(q, "up", "bea", .grant, endsAt: noon.addingTimeInterval(30 * 86_400), occurredAt: noon, at: noon)
            #expect(try await q.status("bea", at: noon).daily.remaining == 480)
            // And after 10 more (30 today), dropping to free leaves 0, not -10
            for index in 0..<10 { #expect(try await q.reserve("bea", "p\(index)", at: noon).admitted) }
            _ = try await apply(q, "down", "bea", .revoke, occurredAt: noon.addingTimeInterval(60), at: noon.addingTimeInterval(60))
            let free = try await q.status("bea", at: noon.addingTimeInterval(60))
            #expect(free.plan == "free" && free.daily.used == 30 && free.daily.remaining == 0)
            #expect(!(try await q.reserve("bea", "f21", at: noon.addingTimeInterval(60)).admitted))
        }
    }

    @Test(arguments: QuotaBackend.allCases) func eachEventAppliesOnceAndOlderEventsChangeNothing(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            let later = noon.addingTimeInterval(600)
            // The same event twice: applied once
            #expect(try await apply(q, "grant-1", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon, at: noon).result == "applied")
            #expect(try await apply(q, "grant-1", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon, at: noon).result == "duplicate")
            // A newer expiry applies
            #expect(try await apply(q, "expire-1", "cid", .revoke, occurredAt: later, at: later).result == "applied")
            #expect(try await q.status("cid", at: later).plan == "free")
            // A grant that happened before it, arriving after it, changes nothing
            let late = try await apply(q, "grant-0", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon.addingTimeInterval(-60), at: later)
            #expect(late.result == "stale" && late.status.plan == "free")
            // And the stale one is remembered too: sent again, it is a duplicate
            #expect(try await apply(q, "grant-0", "cid", .grant, occurredAt: noon.addingTimeInterval(-60), at: later).result == "duplicate")
        }
    }

    @Test(arguments: QuotaBackend.allCases) func theAdminRouteCanSetAnEndAndUnknownPlansAreRefused(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            let end = noon.addingTimeInterval(60)
            let set = try await q.store.setPlan(SetPlan(userId: "dan", plan: "pro", endsAt: end), now: noon)
            #expect(set.isPro && set.planEndsAt == end)
            #expect(try await q.status("dan", at: end).plan == "free")
            let refused = try? await q.store.applySubscription(
                SubscriptionEvent(eventId: "x", userId: "dan", effect: .grant, plan: "gold", endsAt: nil, occurredAt: noon, type: "t"), now: noon
            )
            #expect(refused == nil)
        }
    }
}
