import Foundation
import HistoryCore
import HistoryService
import Messages
import Testing

@Suite("History pages and search", .timeLimit(.minutes(5)))
struct HistoryPagingTests {
    /// `count` completed items of `u1`, one a minute, the newest last; with `everyOtherFailed`,
    /// the even-numbered ones failed.
    func fill(_ database: any HistoryStore, _ count: Int, everyOtherFailed: Bool = false) async throws {
        let events = (0..<count).map { index in
            Events.job(String(format: "job-%03d", index), status: everyOtherFailed && index % 2 == 0 ? .failed : .completed,
                       createdAt: Events.epoch.addingTimeInterval(Double(index) * 60))
        }
        _ = try await database.applyJobEvents(events)
    }

    @Test(arguments: HistoryBackend.allCases) func offsetPagesAndCursorPagesListTheSameItemsNewestFirst(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            try await fill(database, 120)
            var byOffset: [String] = []
            for offset in stride(from: 0, to: 120, by: 25) {
                let page = try await database.page(ListHistory(userId: "u1", limit: 25, offset: offset))
                #expect(page.totalCount == 120)
                byOffset += page.items.map(\.jobId)
            }
            var byCursor: [String] = []
            var cursor: String? = nil
            repeat {
                let page = try await database.page(ListHistory(userId: "u1", limit: 25, cursor: cursor))
                byCursor += page.items.map(\.jobId)
                cursor = page.nextCursor
                #expect(page.hasMore == (cursor != nil))
            } while cursor != nil
            #expect(byOffset.count == 120)
            #expect(byOffset == byCursor)
            #expect(byOffset.first == "job-119" && byOffset.last == "job-000")
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aCursorPageDoesNotShiftWhenNewItemsArriveAtTheTop(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            try await fill(database, 30)
            let first = try await database.page(ListHistory(userId: "u1", limit: 10))
            _ = try await database.applyJobEvents([Events.job("newer", createdAt: Events.epoch.addingTimeInterval(86_400))])
            let second = try await database.page(ListHistory(userId: "u1", limit: 10, cursor: first.nextCursor))
            #expect(second.items.first?.jobId == "job-019")
            #expect(second.totalCount == 31)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aTamperedOrForeignCursorIsRefused(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            try await fill(database, 30)
            let cursor = try #require(try await database.page(ListHistory(userId: "u1", limit: 10)).nextCursor)
            var tampered = Array(cursor)
            tampered[5] = tampered[5] == "A" ? "B" : "A"
            for (token, user, statuses) in [(String(tampered), "u1", [HistoryStatus]()), (cursor, "u2", []), (cursor, "u1", [.failed]), ("garbage", "u1", [])] {
                await #expect(throws: BusError.self) {
                    _ = try await database.page(ListHistory(userId: user, limit: 10, cursor: token, statuses: statuses))
                }
            }
        }
    }

    @Test(arguments: zip([HistoryBackend.sqlite, .sqlite, .postgres, .postgres], [10_000, 0, 10_000, 0]))
    func searchFindsASubstringOfThePromptOrTitleIgnoringCase(backend: HistoryBackend, scanUpTo: Int) async throws {
        // Both ways each store searches: reading the items (a short history) and the trigram
        // index (a long one; PostgreSQL's pg_trgm).
        try await withHistoryStore(backend, scanUpTo: scanUpTo) { database in
            _ = try await database.applyJobEvents([
                Events.job("a", prompt: "Golden SUNSET on the beach"),
                Events.job("b", prompt: "neon city lights", effectId: "grayscale"),
                Events.job("c", prompt: nil, effectId: "sharpen"),
                Events.job("d", user: "u2", prompt: "sunset too"),
                Events.job("e", prompt: "100% off_sale"),
                Events.job("f", status: .failed, prompt: "a failed sunset"),
            ])
            #expect(try await database.page(ListHistory(userId: "u1", query: "unset")).items.map(\.jobId) == ["f", "a"])
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.failed], query: "unset")).items.map(\.jobId) == ["f"])
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.completed], query: "unset")).items.map(\.jobId) == ["a"])
            #expect(try await database.page(ListHistory(userId: "u1", query: "CITY")).items.map(\.jobId) == ["b"])
            #expect(try await database.page(ListHistory(userId: "u1", query: "harp")).items.map(\.jobId) == ["c"])
            #expect(try await database.page(ListHistory(userId: "u1", query: "on")).totalCount == 2)
            #expect(try await database.page(ListHistory(userId: "u1", query: "\"quoted\" %_")).totalCount == 0)
            #expect(try await database.page(ListHistory(userId: "u1", query: "% off_")).items.map(\.jobId) == ["e"])
            #expect(try await database.page(ListHistory(userId: "u1", query: "0%o")).totalCount == 0)
            #expect(try await database.page(ListHistory(userId: "u1", query: "zebra")).totalCount == 0)
        }
    }

    @Test(arguments: zip([HistoryBackend.sqlite, .sqlite, .postgres, .postgres], [10_000, 0, 10_000, 0]))
    func aSearchPagedByCursorOrPastItsEndCountsEveryMatch(backend: HistoryBackend, scanUpTo: Int) async throws {
        try await withHistoryStore(backend, scanUpTo: scanUpTo) { database in
            // Given 40 items, every fourth one a sunset
            let events = (0..<40).map { index in
                Events.job(String(format: "job-%03d", index), prompt: index % 4 == 0 ? "a sunset" : "a city",
                           createdAt: Events.epoch.addingTimeInterval(Double(index) * 60))
            }
            _ = try await database.applyJobEvents(events)
            // When the sunsets are paged by cursor, 3 at a time, and by an offset past the last one
            var byCursor: [String] = []
            var cursor: String? = nil
            repeat {
                let page = try await database.page(ListHistory(userId: "u1", limit: 3, cursor: cursor, query: "sunset"))
                #expect(page.totalCount == 10)
                byCursor += page.items.map(\.jobId)
                cursor = page.nextCursor
            } while cursor != nil
            let pastTheEnd = try await database.page(ListHistory(userId: "u1", limit: 3, offset: 12, query: "sunset"))
            // Then the cursor lists each sunset once, newest first, and every page counts all ten
            #expect(byCursor == stride(from: 36, through: 0, by: -4).map { String(format: "job-%03d", $0) })
            #expect(pastTheEnd.items.isEmpty)
            #expect(pastTheEnd.totalCount == 10)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aPagePastTheLastItemOrOfAnEmptyHistoryCountsEveryItem(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            // Given 20 items, every other one failed, and a user with none
            try await fill(database, 20, everyOtherFailed: true)
            // When pages are asked for past the last item, by offset and by cursor, with and without a filter
            let pastByOffset = try await database.page(ListHistory(userId: "u1", limit: 5, offset: 25))
            let pastFailedByOffset = try await database.page(ListHistory(userId: "u1", limit: 5, offset: 10, statuses: [.failed]))
            let lastFailed = try await database.page(ListHistory(userId: "u1", limit: 10, statuses: [.failed]))
            let empty = try await database.page(ListHistory(userId: "u-none", limit: 5))
            let emptyPast = try await database.page(ListHistory(userId: "u-none", limit: 5, offset: 5))
            // Then each has no item and counts all those of its filter
            #expect(pastByOffset.items.isEmpty && pastByOffset.totalCount == 20 && !pastByOffset.hasMore)
            #expect(pastFailedByOffset.items.isEmpty && pastFailedByOffset.totalCount == 10)
            #expect(lastFailed.items.count == 10 && lastFailed.totalCount == 10 && lastFailed.nextCursor == nil)
            #expect(empty.items.isEmpty && empty.totalCount == 0 && emptyPast.totalCount == 0)
            // And a page read newest first carries the counts of its filter
            let first = try await database.page(ListHistory(userId: "u1", limit: 3))
            #expect(first.items.map(\.jobId) == ["job-019", "job-018", "job-017"] && first.totalCount == 20)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aFilteredHistoryPagesByCursorThroughEveryItemOfItsStatusesNewestFirst(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            // Given 60 items, every other one failed
            try await fill(database, 60, everyOtherFailed: true)
            // When the failed ones are paged by cursor, 7 at a time, and by offset
            var byCursor: [String] = []
            var cursor: String? = nil
            repeat {
                let page = try await database.page(ListHistory(userId: "u1", limit: 7, cursor: cursor, statuses: [.failed]))
                #expect(page.totalCount == 30)
                byCursor += page.items.map(\.jobId)
                cursor = page.nextCursor
            } while cursor != nil
            let byOffset = try await database.page(ListHistory(userId: "u1", limit: 7, offset: 7, statuses: [.failed])).items.map(\.jobId)
            // Then each lists the failed items only, newest first, each once
            let failed = stride(from: 58, through: 0, by: -2).map { String(format: "job-%03d", $0) }
            #expect(byCursor == failed)
            #expect(byOffset == Array(failed[7..<14]))
        }
    }

    @Test(arguments: HistoryBackend.allCases) func theStatusFilterListsQueuedJobsAsProcessing(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([
                Events.job("q", status: .queued), Events.job("p", status: .processing), Events.job("c", status: .completed),
                Events.job("f", status: .failed), Events.job("x", status: .cancelled),
            ])
            #expect(Set(try await database.page(ListHistory(userId: "u1", statuses: [.processing])).items.map(\.jobId)) == ["q", "p"])
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.failed, .cancelled])).totalCount == 2)
            #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 5)
        }
    }
}
