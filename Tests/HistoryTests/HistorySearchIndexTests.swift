import Foundation
import GRDB
import HistoryCore
@testable import HistoryService
import Messages
import Testing

/// The trigram index is kept by the writes themselves since v3 (no triggers): after inserts,
/// events that change an item, a changed prompt and title, deletes and retention, the index holds
/// exactly the items' text (FTS5's `integrity-check` against the item table) and searches find
/// what the items say now.
@Suite("History's search index kept by its writes", .timeLimit(.minutes(2)))
struct HistorySearchIndexTests {
    /// An empty database in memory, its connection prepared as the service's are.
    static func queue() throws -> DatabaseQueue {
        var configuration = Configuration()
        configuration.prepareDatabase(HistoryDatabase.prepare)
        return try DatabaseQueue(configuration: configuration)
    }

    static func integrityCheck(_ queue: DatabaseQueue) async throws {
        try await queue.write { db in try db.execute(sql: "INSERT INTO item_search (item_search, rank) VALUES ('integrity-check', 1)") }
    }

    @Test func theIndexMatchesTheItemsAfterEveryKindOfWrite() async throws {
        let queue = try Self.queue()
        // Given a database of v2, whose triggers kept the index, with an item in it
        try HistoryDatabase.migrator.migrate(queue, upTo: "v2: items clustered by user, creation and job")
        try await queue.write { db in
            try db.execute(sql: """
                INSERT INTO item (userId, effectId, effectTitle, prompt, status, progress, createdAt, updatedAt, resultKey, thumbnailKey,
                    imageKey, parameters, cost, version, changeSequence, jobId, id)
                VALUES ('u1', 'blur', 'Soft Focus', 'a lighthouse at dusk', 'completed', 1, ?, ?, 'results/r.jpg', 'thumbnails/t.jpg',
                    'uploads/u.jpg', '{}', 1, 1, 1, 'old', 1)
                """, arguments: [1_764_000_000_000, 1_764_000_000_000])
            try db.execute(sql: "INSERT INTO item_count (userId, status, count) VALUES ('u1', 'completed', 1)")
            try db.execute(sql: "UPDATE meta SET value = 1 WHERE key IN ('changeSequence', 'itemId')")
        }
        // When the service opens it, the triggers are gone and the item is still found
        let database = try HistoryDatabase(queue, scanUpTo: 0)
        #expect(try await queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'") } == 0)
        // And its writer keeps statement and savepoint journals in memory (`WriterJournalTests`)
        #expect(try await database.write { db in try Int.fetchOne(db, sql: "PRAGMA temp_store") } == 2)
        #expect(try await database.page(ListHistory(userId: "u1", query: "lighthouse")).items.map(\.jobId) == ["old"])

        // And items inserted, then moved on by later events (same text), are found once each
        let prompts = ["a sunset over the sea", "mountains at dawn", "the sea at night", "", "a red bicycle"]
        _ = try await database.applyJobEvents((0..<20).map { index in
            Events.job("j\(index)", status: .queued, prompt: index % 6 == 5 ? nil : prompts[index % prompts.count],
                       createdAt: Events.epoch.addingTimeInterval(Double(index) * 60))
        })
        for version in 2...3 {
            _ = try await database.applyJobEvents((0..<20).map { index in
                Events.job("j\(index)", status: version == 3 ? .completed : .processing, version: version,
                           prompt: index % 6 == 5 ? nil : prompts[index % prompts.count], createdAt: Events.epoch.addingTimeInterval(Double(index) * 60))
            })
        }
        try await Self.integrityCheck(queue)
        #expect(try await database.page(ListHistory(userId: "u1", limit: 100, query: "sea")).items.count == 6)

        // And an event that changes an item's prompt and title moves its entry
        _ = try await database.applyJobEvents([Events.job("j0", version: 4, prompt: "a snowy forest", effectId: "Winter Light")])
        try await Self.integrityCheck(queue)
        // And a prompt with an embedded NUL is indexed, moved and removed whole
        _ = try await database.applyJobEvents([Events.job("nul", prompt: "before\u{0}after the NUL", createdAt: Events.epoch.addingTimeInterval(86_400))])
        _ = try await database.applyJobEvents([Events.job("nul", version: 2, prompt: "then\u{0}changed", createdAt: Events.epoch.addingTimeInterval(86_400))])
        try await Self.integrityCheck(queue)
        _ = try await database.deleteItem("nul", userId: "u1", now: Events.epoch)
        try await Self.integrityCheck(queue)
        #expect(try await database.page(ListHistory(userId: "u1", query: "snowy")).items.map(\.jobId) == ["j0"])
        #expect(try await database.page(ListHistory(userId: "u1", query: "winter light")).items.map(\.jobId) == ["j0"])
        #expect(try await database.page(ListHistory(userId: "u1", limit: 100, query: "sunset")).items.map(\.jobId) == ["j15", "j10"])

        // And deleted and expired items leave it
        _ = try await database.deleteItem("j10", userId: "u1", now: Events.epoch)
        _ = try await database.deleteItem("old", userId: "u1", now: Events.epoch)
        #expect(try await database.deleteExpiredItems(userId: "u1", before: Events.epoch.addingTimeInterval(5 * 60 + 1), limit: 100, now: Events.epoch) == 6)
        try await Self.integrityCheck(queue)
        #expect(try await database.page(ListHistory(userId: "u1", limit: 100, query: "sunset")).items.map(\.jobId) == ["j15"])
        #expect(try await database.page(ListHistory(userId: "u1", query: "lighthouse")).items.isEmpty)
    }

    /// The check can fail: an item whose entry is missing is reported.
    @Test func theCheckFindsAMissingEntry() async throws {
        let queue = try Self.queue()
        let database = try HistoryDatabase(queue, scanUpTo: 0)
        _ = try await database.applyJobEvents([Events.job("a", prompt: "a harbour")])
        try await queue.write { db in
            try HistoryDatabase.SearchIndex.remove(db, id: try Int64.fetchOne(db, sql: "SELECT id FROM item")!)
        }
        await #expect(throws: (any Error).self) { try await Self.integrityCheck(queue) }
    }

    /// A long history searched through the index: from the matches when they are few (a rare
    /// phrase), from the user's items when they are many; both orders answer the same pages and
    /// counts, statuses and cursors included.
    @Test func bothOrdersOfAnIndexSearchAnswerTheSame() async throws {
        let queue = try Self.queue()
        let database = try HistoryDatabase(queue, scanUpTo: 0)
        let statuses: [JobStatus] = [.completed, .failed, .processing]
        var events: [JobEvent] = []
        for index in 0..<300 {
            let prompt = index % 2 == 0 ? "a sunset over the sea" : "mountains at dawn"
            let created = Events.epoch.addingTimeInterval(Double(index) * 60)
            events.append(Events.job("u\(index)", user: index % 3 == 0 ? "u2" : "u1", status: statuses[index % 3], prompt: prompt, createdAt: created))
        }
        events.append(Events.job("rare", prompt: "a zebra crossing", createdAt: Events.epoch.addingTimeInterval(-60)))
        _ = try await database.applyJobEvents(events)
        let requests = [
            ListHistory(userId: "u1", query: "zebra"), ListHistory(userId: "u2", query: "zebra"), ListHistory(userId: "u1", query: "sunset"),
            ListHistory(userId: "u1", limit: 7, offset: 5, query: "sea"), ListHistory(userId: "u1", limit: 9, statuses: [.failed], query: "dawn"),
        ]
        try await queue.read { db in
            // The rare phrase goes from its one match; the common one from the user's items.
            for (query, fromMatches) in [("zebra", true), ("sunset", false)] {
                var filter = HistoryDatabase.Filter(ListHistory(userId: "u1", query: query))
                try filter.chooseIndexOrder(db, userItems: 201)
                #expect(filter.fromMatches == fromMatches, "\(query)")
                let (sql, arguments) = filter.clause(counting: false)
                let plan = try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN SELECT jobId FROM item WHERE " + sql, arguments: StatementArguments(arguments))
                    .map { $0["detail"] as String }.joined(separator: "; ")
                #expect(plan.contains("(id=?)") == fromMatches, "\(query): \(plan)")
            }
            // Every request, and its cursor pages to the end, the same both ways.
            for request in requests {
                var answers: [[String]] = []
                for fromMatches in [false, true] {
                    var filter = HistoryDatabase.Filter(request)
                    filter.fromMatches = fromMatches
                    if fromMatches { try filter.readMatchedKeys(db) }
                    var pages = ["\(try filter.count(db))"]
                    pages.append(try filter.items(db, limit: request.limit, offset: request.offset).map(\.jobId).joined(separator: ","))
                    var last = try filter.items(db, limit: 10, offset: 0).last
                    while let item = last {
                        filter.after(PageCursor(createdAt: item.createdAt.milliseconds, jobId: item.jobId))
                        let page = try filter.items(db, limit: 10, offset: 0)
                        pages.append(page.map(\.jobId).joined(separator: ","))
                        last = page.last
                    }
                    answers.append(pages)
                }
                #expect(answers[0] == answers[1], "\(request)")
                #expect(answers[0].count > 2 || answers[0][0] == "0", "\(request): cursor pages were followed")
            }
        }
        #expect(try await database.page(ListHistory(userId: "u1", query: "zebra")).items.map(\.jobId) == ["rare"])
        #expect(try await database.page(ListHistory(userId: "u2", query: "zebra")).totalCount == 0)
    }
}
