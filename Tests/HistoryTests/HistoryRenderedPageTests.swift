import Foundation
import HistoryService
import Messages
import Testing

/// Both stores write `history.page`'s items straight from their rows (`WrittenPage`: SQLite's
/// from the statement's columns, PostgreSQL's from a record per item): the answer must be exactly
/// the one written from the items (`RenderedHistoryPage(page)`), which `HistoryJSONTests` holds to
/// the app's JSON.
@Suite("History pages written from rows", .timeLimit(.minutes(5)))
struct HistoryRenderedPageTests {
    /// Items of every status, with text to escape, non-ASCII, an embedded NUL (SQLite only:
    /// PostgreSQL's text cannot hold one), no prompt, an empty one, parameters and none,
    /// fractional progress and milliseconds.
    static func events(_ backend: HistoryBackend = .sqlite) -> [JobEvent] {
        let prompts: [String?] = [
            "a sunset over the sea", nil, "", "quote \" and backslash \\ and\nnewline\ttab", "emoji 🌅 and ümlaut, 日本語",
            "control \u{01}\u{1F} bytes", backend == .sqlite ? "before\u{0}after the NUL" : "before", "slash / stays",
        ]
        let statuses: [JobStatus] = [.queued, .processing, .completed, .failed, .cancelled]
        return (0..<40).map { index in
            var event = Events.job(
                String(format: "job-%03d", index), status: statuses[index % statuses.count], prompt: prompts[index % prompts.count],
                createdAt: Events.epoch.addingTimeInterval(Double(index) * 61.007), effectId: index % 3 == 0 ? "blur" : "title \"\(index)\""
            )
            event.job.parameters = index % 4 == 0 ? [:] : ["sigma": Double(index) / 8, "amount": -0.35, "tiny": 1e-7]
            event.job.progress = index % 5 == 1 ? Double(index) / 41 : event.job.progress
            if event.job.status == .failed, index % 2 == 0 { event.job.lastError = "provider said \"no\"\n(\(index))" }
            if event.job.status == .failed, index % 3 == 0 { event.job.lastError = nil }
            if event.job.status == .completed, index % 4 == 2 { event.job.thumbnailKey = nil }
            // Retried and then completed: the first attempt's error is kept, and not shown.
            if event.job.status == .completed, index % 3 == 1 { event.job.lastError = "attempt 1 timed out" }
            event.job.credits = index % 7
            return event
        }
    }

    /// Searches both scan a user's items (`scanUpTo` 10,000) and read the search index (0).
    @Test(arguments: zip([HistoryBackend.sqlite, .sqlite, .postgres, .postgres], [10_000, 0, 10_000, 0]))
    func everyPageIsTheOneWrittenFromItsItems(backend: HistoryBackend, scanUpTo: Int) async throws {
        try await withHistoryStore(backend, scanUpTo: scanUpTo) { database in try await Self.everyPageIsTheOneWrittenFromItsItems(database, backend) }
    }

    static func everyPageIsTheOneWrittenFromItsItems(_ database: any HistoryStore, _ backend: HistoryBackend) async throws {
        _ = try await database.applyJobEvents(Self.events(backend))
        var requests = [
            ListHistory(userId: "u1"), ListHistory(userId: "u1", limit: 1), ListHistory(userId: "u1", limit: 7, offset: 3),
            ListHistory(userId: "u1", limit: 100), ListHistory(userId: "u1", limit: 10, offset: 39), ListHistory(userId: "u1", offset: 40),
            ListHistory(userId: "u1", limit: 5, statuses: [.failed]), ListHistory(userId: "u1", limit: 4, statuses: [.processing, .completed]),
            ListHistory(userId: "u1", query: "sunset"), ListHistory(userId: "u1", limit: 3, query: "ü"),
            ListHistory(userId: "u1", limit: 6, groupByMonth: true), ListHistory(userId: "someone-else"),
            ListHistory(userId: "u1", limit: 5, offset: 200, statuses: [.failed]), ListHistory(userId: "u1", query: "no such words"),
            ListHistory(userId: "u1", limit: 2, offset: 100, query: "sunset"), ListHistory(userId: "u1", limit: 4, statuses: [.failed], query: "e"),
        ]
        // Cursor pages: each page's cursor, followed to the end, with a filter and without.
        for (statuses, query) in [([], nil), ([HistoryStatus.completed, .failed], nil), ([], "a")] {
            var cursor: String? = nil
            repeat {
                let request = ListHistory(userId: "u1", limit: 9, cursor: cursor, statuses: statuses, query: query)
                requests.append(request)
                cursor = try await database.renderedPage(request).nextCursor
            } while cursor != nil
        }
        for request in requests {
            let written = try await database.renderedPage(request)
            #expect(written == RenderedHistoryPage(try await database.page(request)), "\(request)")
        }
        // The pages were not empty: every status, the escapes and the NUL's truncation are in them.
        let all = try await database.renderedPage(ListHistory(userId: "u1", limit: 100)).headText
        #expect(all.contains(#""error":"provider said \"no\"\n(8)""#))
        #expect(all.contains(#""prompt":"before""#) && !all.contains("after the NUL"))
        #expect(all.contains(#""prompt":"emoji 🌅 and ümlaut, 日本語""#) && all.contains(#""prompt":"slash / stays""#))
        #expect(written(all, "job-005") && written(all, "job-039"))
        #expect(all.contains(#""prompt":"control \u0001\u001f bytes""#))
        #expect(all.contains(#""parameters":{}"#) && all.contains(#""parameters":{"amount":-0.35,"sigma":0.125,"tiny":1e-07}"#))
        #expect(all.contains(#""progress":"#))
    }

    /// Whether the page's text holds the item `jobId`.
    static func written(_ text: String, _ jobId: String) -> Bool { text.contains(#""id":"\#(jobId)""#) }

    @Test(arguments: HistoryBackend.allCases) func aCursorOfAnotherQueryIsRefusedAsBefore(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in try await Self.aCursorOfAnotherQueryIsRefusedAsBefore(database, backend) }
    }

    static func aCursorOfAnotherQueryIsRefusedAsBefore(_ database: any HistoryStore, _ backend: HistoryBackend) async throws {
        _ = try await database.applyJobEvents(Self.events(backend))
        let cursor = try #require(try await database.renderedPage(ListHistory(userId: "u1", limit: 5)).nextCursor)
        await #expect(throws: BusError.self) { try await database.renderedPage(ListHistory(userId: "u1", limit: 5, cursor: cursor, query: "sea")) }
        await #expect(throws: BusError.self) { try await database.renderedPage(ListHistory(userId: "u2", limit: 5, cursor: cursor)) }
    }
}
