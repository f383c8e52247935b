import Foundation
import GRDB
import Messages
import QuotaCore
@testable import QuotaService
import Testing

@Suite("Plans with an end and subscription events")
struct SubscriptionTests {
    let ledger = QuotaLedger(plans: .standard)
    let database: QuotaDatabase
    let noon = try! Date("2026-11-21T12:00:00Z", strategy: .iso8601)

    init() throws { database = try QuotaDatabase.inMemory() }

    func reserve(_ user: String, _ job: String, at now: Date) throws -> QuotaDecision {
        try database.writer.write { try ledger.reserve($0, ReserveQuota(userId: user, jobId: job, cost: 1), now: now) }
    }

    func status(_ user: String, at now: Date) throws -> QuotaStatus {
        try database.writer.read { try ledger.status($0, user: user, now: now) }
    }

    func apply(_ id: String, _ user: String, _ effect: SubscriptionEvent.Effect, endsAt: Date? = nil, occurredAt: Date, at now: Date) throws -> SubscriptionOutcome {
        try database.writer.write {
            try ledger.applySubscription($0, SubscriptionEvent(
                eventId: id, userId: user, effect: effect, plan: "pro", endsAt: endsAt, occurredAt: occurredAt,
                type: effect == .grant ? "subscription_started" : "subscription_expired"
            ), now: now)
        }
    }

    @Test func proEndsAtThePeriodsEndWithNoExpiryEvent() throws {
        // Given a grant until 13:00
        let end = noon.addingTimeInterval(3600)
        #expect(try apply("e1", "ann", .grant, endsAt: end, occurredAt: noon, at: noon).result == "applied")
        // Then until then the user is PRO, with the end said
        let during = try status("ann", at: end.addingTimeInterval(-1))
        #expect(during.isPro && during.plan == "pro" && during.planEndsAt == end)
        #expect(try reserve("ann", "j1", at: end.addingTimeInterval(-1)).status.isPro)
        // And from the end on, free for every decision, though no expiry event ever came
        let after = try status("ann", at: end)
        #expect(!after.isPro && after.plan == "free" && after.planEndsAt == nil)
        #expect(!(try reserve("ann", "j2", at: end).status.isPro))
    }

    @Test func usageCarriesAcrossUpgradeAndDowngradeWithinADayAndIsNeverNegative() throws {
        // Given 20 edits on free today
        for index in 0..<20 { #expect(try reserve("bea", "f\(index)", at: noon).admitted) }
        #expect(!(try reserve("bea", "f20", at: noon).admitted))
        // When she upgrades, she has 480 of PRO's 500 left today
        _ = try apply("up", "bea", .grant, endsAt: noon.addingTimeInterval(30 * 86_400), occurredAt: noon, at: noon)
        #expect(try status("bea", at: noon).daily.remaining == 480)
        // And after 10 more (30 today), dropping to free leaves 0, not -10
        for index in 0..<10 { #expect(try reserve("bea", "p\(index)", at: noon).admitted) }
        _ = try apply("down", "bea", .revoke, occurredAt: noon.addingTimeInterval(60), at: noon.addingTimeInterval(60))
        let free = try status("bea", at: noon.addingTimeInterval(60))
        #expect(free.plan == "free" && free.daily.used == 30 && free.daily.remaining == 0)
        #expect(!(try reserve("bea", "f21", at: noon.addingTimeInterval(60)).admitted))
    }

    @Test func eachEventAppliesOnceAndOlderEventsChangeNothing() throws {
        let later = noon.addingTimeInterval(600)
        // The same event twice: applied once
        #expect(try apply("grant-1", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon, at: noon).result == "applied")
        #expect(try apply("grant-1", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon, at: noon).result == "duplicate")
        // A newer expiry applies
        #expect(try apply("expire-1", "cid", .revoke, occurredAt: later, at: later).result == "applied")
        #expect(try status("cid", at: later).plan == "free")
        // A grant that happened before it, arriving after it, changes nothing
        let late = try apply("grant-0", "cid", .grant, endsAt: noon.addingTimeInterval(86_400), occurredAt: noon.addingTimeInterval(-60), at: later)
        #expect(late.result == "stale" && late.status.plan == "free")
        // And the stale one is remembered too: sent again, it is a duplicate
        #expect(try apply("grant-0", "cid", .grant, occurredAt: noon.addingTimeInterval(-60), at: later).result == "duplicate")
    }

    @Test func theAdminRouteCanSetAnEndAndUnknownPlansAreRefused() throws {
        let end = noon.addingTimeInterval(60)
        let set = try database.writer.write { try ledger.setPlan($0, SetPlan(userId: "dan", plan: "pro", endsAt: end), now: noon) }
        #expect(set.isPro && set.planEndsAt == end)
        #expect(try status("dan", at: end).plan == "free")
        let refused = try? database.writer.write {
            try ledger.applySubscription($0, SubscriptionEvent(eventId: "x", userId: "dan", effect: .grant, plan: "gold", endsAt: nil, occurredAt: noon, type: "t"), now: noon)
        }
        #expect(refused == nil)
    }
}
