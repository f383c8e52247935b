import Foundation
import HistoryCore
import HistoryService
import Messages
import Testing

@Suite("History rules", .timeLimit(.minutes(5)))
struct HistoryRulesTests {
    @Test func monthsAreCutInTheUsersTimeZone() throws {
        // 2025-11-30T23:30Z is 08:30 on December 1st in Tokyo.
        let late = Events.job("late", createdAt: try Date("2025-11-30T23:30:00Z", strategy: .iso8601))
        let early = Events.job("early", createdAt: try Date("2025-11-15T12:00:00Z", strategy: .iso8601))
        let items = [late, early].map { HistoryItem(event: $0) }
        let tokyo = MonthSections.group(items, timeZone: "Asia/Tokyo", locale: nil)
        #expect(tokyo.map(\.month) == ["2025-12", "2025-11"])
        #expect(tokyo.map(\.title) == ["December 2025", "November 2025"])
        let utc = MonthSections.group(items, timeZone: nil, locale: nil)
        #expect(utc.map(\.month) == ["2025-11"])
        #expect(utc.first?.items.count == 2)
    }

    @Test func titlesFollowTheLanguageFoundationFormats() throws {
        let item = HistoryItem(event: Events.job("a", createdAt: try Date("2025-11-15T12:00:00Z", strategy: .iso8601)))
        #expect(MonthSections.group([item], timeZone: nil, locale: "fr-FR").first?.title == "novembre 2025")
        #expect(MonthSections.group([item], timeZone: nil, locale: "de").first?.title == "November 2025")
        #expect(MonthSections.group([item], timeZone: nil, locale: "xx-unknown").first?.title == "November 2025")
    }

    @Test func retentionTakesEndedJobsOnlyFromBeforeItsCutoff() throws {
        // The sweep's SQL takes its statuses and its cutoff from this rule
        #expect(Set(RetentionRule.sweepable) == [.completed, .failed, .cancelled])
        let now = Events.epoch.addingTimeInterval(31 * 86_400)
        #expect(RetentionRule.cutoff(now: now, retentionDays: 30) == Events.epoch.addingTimeInterval(86_400))
        #expect(RetentionRule.cutoff(now: now, retentionDays: 0) == now.addingTimeInterval(-86_400), "a day at least")
    }

    @Test(arguments: HistoryBackend.allCases) func theSweepDeletesOnlyEndedItemsPastTheCutoff(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            let now = Events.epoch.addingTimeInterval(31 * 86_400)
            _ = try await database.applyJobEvents([
                Events.job("old"), Events.job("old-failed", status: .failed), Events.job("old-cancelled", status: .cancelled),
                Events.job("old-running", status: .processing), Events.job("old-queued", status: .queued),
                Events.job("recent", createdAt: now.addingTimeInterval(-86_400)),
            ])
            let cutoff = RetentionRule.cutoff(now: now, retentionDays: 30)
            #expect(try await database.usersWithItems(before: cutoff, afterUser: "", limit: 10).users == ["u1"])
            #expect(try await database.deleteExpiredItems(userId: "u1", before: cutoff, limit: 10, now: now) == 3)
            #expect(Set(try await database.page(ListHistory(userId: "u1")).items.map(\.jobId)) == ["old-running", "old-queued", "recent"])
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aShareOpensUntilItExpiresOrIsRevoked(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("done"), Events.job("running", status: .processing)])
            let now = Date()
            let grant = try #require(try await database.shareItem("done", userId: "u1", token: "t1", expiresAt: now.addingTimeInterval(60)))
            #expect(try await database.sharedResult(token: grant.token, now: now)?.resultKey == "results/done/1.jpg")
            #expect(try await database.sharedResult(token: grant.token, now: now.addingTimeInterval(61)) == nil)
            #expect(try await database.shareItem("done", userId: "u2", token: "t2", expiresAt: now.addingTimeInterval(60)) == nil)
            await #expect(throws: BusError.self) { _ = try await database.shareItem("running", userId: "u1", token: "t3", expiresAt: now.addingTimeInterval(60)) }
            #expect(try await database.revokeShares("done", userId: "u1"))
            #expect(try await database.sharedResult(token: grant.token, now: now) == nil)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func anItemKeepsAtMostTenLiveLinksRevokingTheOldest(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("done")])
            let now = Date()
            for index in 0..<12 {
                _ = try await database.shareItem("done", userId: "u1", token: "t\(index)", expiresAt: now.addingTimeInterval(Double(60 + index)))
            }
            #expect(try await database.sharedResult(token: "t0", now: now) == nil)
            #expect(try await database.sharedResult(token: "t1", now: now) == nil)
            #expect(try await database.sharedResult(token: "t2", now: now) != nil)
            #expect(try await database.sharedResult(token: "t11", now: now) != nil)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func sweepCandidatesAreThoseWithOldItemsAmongTheUsersScanned(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            let now = Events.epoch.addingTimeInterval(40 * 86_400)
            _ = try await database.applyJobEvents([
                Events.job("a", user: "a-old"), Events.job("b", user: "b-new", createdAt: now), Events.job("c", user: "c-old"),
            ])
            let cutoff = RetentionRule.cutoff(now: now, retentionDays: 30)
            let first = try await database.usersWithItems(before: cutoff, afterUser: "", limit: 2)
            #expect(first.users == ["a-old"] && first.scannedThrough == "b-new")
            let second = try await database.usersWithItems(before: cutoff, afterUser: "b-new", limit: 2)
            #expect(second.users == ["c-old"] && second.scannedThrough == "c-old")
            #expect(try await database.usersWithItems(before: cutoff, afterUser: "c-old", limit: 2).scannedThrough == nil)
        }
    }
}

extension HistoryItem {
    /// The item an event makes, for rules that take items.
    init(event: JobEvent) {
        let job = event.job
        self.init(
            jobId: job.id, userId: job.userId, effectId: job.effectId, effectTitle: event.effectTitle, prompt: job.prompt, status: job.status,
            progress: job.progress, createdAt: job.createdAt, updatedAt: job.updatedAt, finishedAt: job.finishedAt, resultKey: job.resultKey,
            thumbnailKey: job.thumbnailKey, originalImageKey: job.imageKey, parameters: job.parameters, cost: 1, lastError: job.lastError,
            version: job.version
        )
    }
}
