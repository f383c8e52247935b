import Foundation
import Messages
import QuotaCore
import QuotaService
import Testing

/// The quota store's rules, against both implementations (SQLite and PostgreSQL).
@Suite("Quota ledger", .timeLimit(.minutes(5)))
struct QuotaLedgerTests {
    let noon = try! Date("2026-11-21T12:00:00Z", strategy: .iso8601)

    @Test(arguments: QuotaBackend.allCases) func freeUserGetsTwentyADayAndTheTwentyFirstIsDeniedNamingDaily(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given a free user with a fresh day
            for index in 1...20 {
                let decision = try await q.reserve("alice", "job-\(index)", at: noon)
                #expect(decision.admitted)
                #expect(decision.status.daily.remaining == 20 - index)
            }
            // When the 21st edit of the day is reserved
            let denied = try await q.reserve("alice", "job-21", at: noon)
            // Then it is denied naming the daily window, retryable at the next UTC midnight
            #expect(!denied.admitted)
            #expect(denied.violated == ["daily"])
            #expect(denied.retryAt == (try Date("2026-11-22T00:00:00Z", strategy: .iso8601)))
            #expect(denied.status.daily.used == 20)
            #expect(denied.status.monthly.used == 20)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func freeUserReachesSixHundredAcrossTheMonthThenIsDeniedNamingMonthly(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given 20 edits a day on each of the first 30 days of November (injected clock)
            let first = try Date("2026-11-01T09:00:00Z", strategy: .iso8601)
            for day in 0..<30 {
                let when = first.addingTimeInterval(Double(day) * 86_400)
                for index in 0..<20 {
                    #expect(try await q.reserve("bob", "d\(day)-\(index)", at: when).admitted)
                }
            }
            // When a fresh day... there is none left in November: December 1st resets both
            let lastDay = try Date("2026-11-30T23:00:00Z", strategy: .iso8601)
            let denied = try await q.reserve("bob", "one-more", at: lastDay)
            #expect(!denied.admitted)
            #expect(Set(denied.violated) == ["daily", "monthly"])
            #expect(denied.status.monthly.used == 600)
            #expect(denied.retryAt == (try Date("2026-12-01T00:00:00Z", strategy: .iso8601)))
        }
    }

    @Test(arguments: QuotaBackend.allCases) func monthlyLimitAloneDeniesWhenTheDayHasRoom(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // 29 days of 20 and one day of 20 in a 31-day month: the 31st has daily room, no monthly room.
            let first = try Date("2026-12-01T09:00:00Z", strategy: .iso8601)
            for day in 0..<30 {
                for index in 0..<20 {
                    _ = try await q.reserve("carol", "d\(day)-\(index)", at: first.addingTimeInterval(Double(day) * 86_400))
                }
            }
            let thirtyFirst = try Date("2026-12-31T10:00:00Z", strategy: .iso8601)
            let denied = try await q.reserve("carol", "new-year-eve", at: thirtyFirst)
            #expect(denied.violated == ["monthly"])
            #expect(denied.status.daily.used == 0)
            #expect(denied.retryAt == (try Date("2027-01-01T00:00:00Z", strategy: .iso8601)))
        }
    }

    @Test(arguments: QuotaBackend.allCases) func proUserGetsFiveHundredADayThenFairUseDenialAndNeverAMonthlyOne(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            _ = try await q.store.setPlan(SetPlan(userId: "dana", plan: "pro"), now: noon)
            for index in 1...500 {
                #expect(try await q.reserve("dana", "p\(index)", at: noon).admitted)
            }
            let denied = try await q.reserve("dana", "p501", at: noon)
            #expect(denied.violated == ["daily"])
            #expect(denied.status.isPro)
            #expect(denied.status.monthly.limit == nil)
            #expect(denied.status.monthly.remaining == nil)
            // The next days keep admitting: there is no monthly cap.
            for day in 1...3 {
                #expect(try await q.reserve("dana", "later-\(day)", at: noon.addingTimeInterval(Double(day) * 86_400)).admitted)
            }
        }
    }

    @Test(arguments: QuotaBackend.allCases) func sameJobIdReservedTwiceChargesOnce(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            let first = try await q.reserve("erin", "job-1", at: noon)
            let second = try await q.reserve("erin", "job-1", at: noon)
            #expect(first.admitted && second.admitted)
            #expect(second.status.daily.used == 1)
            // Another user cannot take the job id.
            #expect(await busError { _ = try await q.reserve("mallory", "job-1", at: noon) }?.code == Quota.ErrorCode.jobIdTaken)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func releaseTwiceGivesBackOnceAndCommitAfterReleaseIsRefused(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            _ = try await q.reserve("frank", "job-1", at: noon)
            _ = try await q.reserve("frank", "job-2", at: noon)
            let released = try await q.store.release(jobId: "job-1", now: noon)
            let again = try await q.store.release(jobId: "job-1", now: noon)
            #expect(released.state == .released && again.state == .released)
            let status = try await q.store.status(userId: "frank", now: noon)
            #expect(status.daily.used == 1)
            // Commit after release: refused, nothing changes
            #expect(await busError { _ = try await q.store.commit(jobId: "job-1", now: noon) }?.code == Quota.ErrorCode.chargeSettled)
            let after = try await q.store.status(userId: "frank", now: noon)
            #expect(after.daily.used == 1)
            // Commit is idempotent, and a committed charge cannot be released.
            #expect(try await q.store.commit(jobId: "job-2", now: noon).state == .committed)
            #expect(try await q.store.commit(jobId: "job-2", now: noon).state == .committed)
            #expect(await busError { _ = try await q.store.release(jobId: "job-2", now: noon) }?.code == Quota.ErrorCode.chargeSettled)
            #expect(await busError { _ = try await q.store.commit(jobId: "nope", now: noon) }?.code == .notFound)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func aReleasedJobIdReservedAgainIsChargedAfreshAndCanBeCommitted(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given a reservation released because its job was definitely not created
            _ = try await q.reserve("gina", "retried", cost: 3, at: noon)
            _ = try await q.store.release(jobId: "retried", now: noon)
            #expect(try await q.status("gina", at: noon).daily.used == 0)
            // When the client sends the same request again (the same Idempotency-Key, so the same job id)
            let again = try await q.reserve("gina", "retried", cost: 3, at: noon)
            // Then it is admitted and charged once more, and its job's completion commits it
            #expect(again.admitted)
            #expect(try await q.status("gina", at: noon).daily.used == 3)
            #expect(try await q.store.commit(jobId: "retried", now: noon).state == .committed)
            // And a third send charges nothing more
            #expect(try await q.reserve("gina", "retried", cost: 3, at: noon).admitted)
            #expect(try await q.status("gina", at: noon).daily.used == 3)
            // And another user still cannot take the id
            #expect(await busError { _ = try await q.reserve("mallory", "retried", at: noon) }?.code == Quota.ErrorCode.jobIdTaken)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func grantsAndTakebacksMoveBothWindowsExactlyOncePerAdjustment(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            for index in 0..<3 { _ = try await q.reserve("hana", "job-\(index)", at: noon) }
            // A grant of 10 to a user who used 3: used goes to -7, so 27 are left today
            let adjusted = try await q.store.adjust(AdjustCredits(userId: "hana", credits: 10, adjustmentId: "support-1"), now: noon)
            #expect(adjusted.applied)
            let granted = adjusted.status
            #expect(granted.daily.used == -7 && granted.daily.remaining == 27 && granted.monthly.used == -7 && granted.monthly.remaining == 607)
            #expect(try await q.status("hana", at: noon) == granted)
            // The same adjustment again changes nothing
            #expect(try await q.store.adjust(AdjustCredits(userId: "hana", credits: 10, adjustmentId: "support-1"), now: noon) == CreditsAdjusted(applied: false, status: granted))
            // Nor can another user's adjustment take its id
            #expect(await busError { _ = try await q.store.adjust(AdjustCredits(userId: "mallory", credits: 10, adjustmentId: "support-1"), now: noon) }?.code
                    == Quota.ErrorCode.jobIdTaken)
            // A release after the grant gives back exactly its cost (not clamped at zero)
            _ = try await q.store.release(jobId: "job-0", now: noon)
            #expect(try await q.status("hana", at: noon).daily.used == -8)
            // 28 more are admitted today, the 29th denied
            for index in 0..<28 { #expect(try await q.reserve("hana", "more-\(index)", at: noon).admitted) }
            #expect(try await q.reserve("hana", "one-too-many", at: noon).admitted == false)
            // A takeback: 5 more used
            let taken = try await q.store.adjust(AdjustCredits(userId: "hana", credits: -5, adjustmentId: "support-2"), now: noon).status
            #expect(taken.daily.used == 25 && taken.daily.remaining == 0 && taken.monthly.used == 25)
            // Both are among the user's charges, a grant as a negative one
            let charges = try await q.store.usage(userId: "hana", now: noon).charges
            #expect(charges.first { $0.jobId == "grant:support-1" }?.cost == -10 && charges.first { $0.jobId == "grant:support-2" }?.cost == 5)
            #expect(charges.filter { $0.jobId.hasPrefix("grant:") }.allSatisfy { $0.state == .committed })
            // Bad amounts are refused
            for credits in [0, 10_001, -10_001] {
                #expect(await busError { _ = try await q.store.adjust(AdjustCredits(userId: "hana", credits: credits, adjustmentId: "bad-\(credits)"), now: noon) }?.code == .badRequest)
            }
            // The next day starts afresh; the month keeps the adjustments
            let tomorrow = noon.addingTimeInterval(86_400)
            let next = try await q.status("hana", at: tomorrow)
            #expect(next.daily.used == 0 && next.monthly.used == 25)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func releasingYesterdaysChargeAfterMidnightDoesNotAddToToday(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            let lateEvening = try Date("2026-11-21T23:50:00Z", strategy: .iso8601)
            let afterMidnight = try Date("2026-11-22T00:10:00Z", strategy: .iso8601)
            _ = try await q.reserve("gina", "yesterday", at: lateEvening)
            _ = try await q.reserve("gina", "today", at: afterMidnight)
            _ = try await q.store.release(jobId: "yesterday", now: afterMidnight)
            let status = try await q.store.status(userId: "gina", now: afterMidnight)
            #expect(status.daily.used == 1)
            #expect(status.monthly.used == 1)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func windowsFollowTheUsersTimeZone(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            _ = try await q.store.setPlan(SetPlan(userId: "hiro", plan: "free", timeZone: "Asia/Tokyo"), now: noon)
            // 2026-11-21T16:00Z is already the 22nd in Tokyo.
            let decision = try await q.reserve("hiro", "job", at: try Date("2026-11-21T16:00:00Z", strategy: .iso8601))
            #expect(decision.status.daily.startsAt == (try Date("2026-11-21T15:00:00Z", strategy: .iso8601)))
            #expect(decision.status.daily.resetsAt == (try Date("2026-11-22T15:00:00Z", strategy: .iso8601)))
            #expect(decision.status.timeZone == "Asia/Tokyo")
        }
    }

    @Test(arguments: QuotaBackend.allCases) func aZonedUsersDayCountsWhatItUsedWhileUTCIsStillOnTheDayBefore(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            _ = try await q.store.setPlan(SetPlan(userId: "hiro", plan: "free", timeZone: "Asia/Tokyo"), now: noon)
            // 16:00Z and 20:00Z on the 21st are both the 22nd in Tokyo (not UTC's day: on
            // PostgreSQL, that window is read only for a user whose row names a zone).
            _ = try await q.reserve("hiro", "first", cost: 3, at: try Date("2026-11-21T16:00:00Z", strategy: .iso8601))
            let second = try await q.reserve("hiro", "second", cost: 2, at: try Date("2026-11-21T20:00:00Z", strategy: .iso8601))
            #expect(second.status.daily.used == 5)
            #expect(second.status.monthly.used == 5)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func badInputGetsTypedErrors(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            #expect(await busError { _ = try await q.reserve("ivan", "j", cost: 0, at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.reserve("ivan", "j", cost: -3, at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.reserve("ivan", "j", cost: 1_000_000, at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.reserve(String(repeating: "u", count: 300), "j", at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.reserve("ivan", String(repeating: "j", count: 300), at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.reserve("", "j", at: noon) }?.code == .badRequest)
            #expect(await busError { _ = try await q.store.setPlan(SetPlan(userId: "ivan", plan: "platinum"), now: noon) }?.code == Quota.ErrorCode.unknownPlan)
            #expect(await busError { _ = try await q.store.setPlan(SetPlan(userId: "ivan", plan: "pro", timeZone: "Nowhere/Land"), now: noon) }?.code == Quota.ErrorCode.unknownTimeZone)
            // Nothing was charged by any of them.
            let status = try await q.store.status(userId: "ivan", now: noon)
            #expect(status.daily.used == 0)
            #expect(status.plan == "free")
        }
    }

    @Test(arguments: QuotaBackend.allCases) func guestsOfANetworkShareItsCreditsAndAReleaseGivesThemBack(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend, guests: GuestLimits(perNetworkHour: 2, networkDaily: 5)) { q in
            func reserve(_ user: String, _ job: String, cost: Int) async throws -> QuotaDecision {
                try await q.reserve(user, job, cost: cost, network: "v4:203.0.113.0/24", at: noon)
            }
            #expect(try await reserve("device:a", "j1", cost: 4).admitted)
            let denied = try await reserve("device:b", "j2", cost: 2)
            #expect(!denied.admitted && denied.violated == ["network"] && denied.networkRemaining == 1)
            _ = try await q.store.release(jobId: "j1", now: noon)
            #expect(try await reserve("device:b", "j3", cost: 5).admitted, "the released 4 went back to the network")
            // New guest ids: two an hour from this network, then refused until the first is an hour old
            func admit(_ user: String, at now: Date) async throws -> GuestAdmission {
                try await q.store.admitGuest(AdmitGuest(userId: user, network: "v4:203.0.113.0/24"), now: now)
            }
            #expect(try await admit("device:a", at: noon).admitted)
            #expect(try await admit("device:b", at: noon.addingTimeInterval(60)).admitted)
            let refused = try await admit("device:c", at: noon.addingTimeInterval(120))
            #expect(!refused.admitted && refused.retryAt == noon.addingTimeInterval(3600))
            #expect(try await admit("device:a", at: noon.addingTimeInterval(120)).admitted, "a known guest is admitted again")
            #expect(try await admit("device:c", at: noon.addingTimeInterval(3601)).admitted)
        }
    }

    @Test(arguments: QuotaBackend.allCases) func settledChargesAreForgottenOnceTheWindowIsPastAndReservationsNever(_ backend: QuotaBackend) async throws {
        try await withQuotaStore(backend) { q in
            // Given charges settled at noon, one settled twenty hours later, and one never settled
            _ = try await q.reserve("ivy", "old-committed", at: noon)
            _ = try await q.store.commit(jobId: "old-committed", now: noon)
            _ = try await q.reserve("ivy", "old-released", at: noon)
            _ = try await q.store.release(jobId: "old-released", now: noon)
            _ = try await q.reserve("ivy", "still-reserved", at: noon)
            let later = noon.addingTimeInterval(20 * 3600)
            _ = try await q.reserve("ivy", "recent", at: later)
            _ = try await q.store.commit(jobId: "recent", now: later)
            _ = try await q.store.usage(userId: "ivy", now: later)  // (on SQLite: once the tables hold them)
            // When the charges settled before an hour after noon are forgotten, one at a time
            let cutoff = noon.addingTimeInterval(3600)
            #expect(try await q.store.forget(settledBefore: cutoff, limit: 1) == 1)
            #expect(try await q.store.forget(settledBefore: cutoff, limit: 100) == 1)
            #expect(try await q.store.forget(settledBefore: cutoff, limit: 100) == 0)
            // Then only the reservation and the recent charge are left, and the windows are as they were
            let next = noon.addingTimeInterval(48 * 3600)  // two days on: no charge of that day yet
            let usage = try await q.store.usage(userId: "ivy", now: later)
            #expect(Set(usage.charges.map(\.jobId)) == ["still-reserved", "recent"])
            #expect(usage.status.daily.used == 1)
            #expect(try await q.status("ivy", at: noon).daily.used == 2)
            // And the reservation still settles, however old
            #expect(try await q.store.release(jobId: "still-reserved", now: next).state == .released)
            // And a remembered id sent again is answered again, charging nothing; a forgotten one
            // is a new charge (the gateway refuses such a creation and gives it back)
            let replay = try await q.reserve("ivy", "recent", at: next)
            #expect(replay.admitted && replay.replayed == true && replay.status.daily.used == 0)
            let fresh = try await q.reserve("ivy", "old-committed", at: next)
            #expect(fresh.admitted && fresh.replayed == nil && fresh.status.daily.used == 1)
            #expect(try await q.store.release(jobId: "old-committed", now: next).state == .released)
            #expect(try await q.status("ivy", at: next).daily.used == 0)
            // And a forgotten id cannot be settled any more
            #expect(await busError { _ = try await q.store.commit(jobId: "old-released", now: next) }?.code == .notFound)
        }
    }
}
