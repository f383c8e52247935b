import Foundation
import HistoryService
import Logging
import Messages
import PostgresNIO
import Storage
import Testing
import TestSupport

/// History on PostgreSQL reads pages, counts and small searches through statements prepared once
/// per connection, whose plans PostgreSQL keeps. These hold that a plan kept while the database was
/// young still reads a user's items by index once the tables have grown.
@Suite("History on PostgreSQL, kept plans", .timeLimit(.minutes(5)))
struct PostgresHistoryPlanTests {
    @Test func pagesAndSearchesReadByIndexAfterTheTablesGrowPastThePlanMadeWhenTheyWereSmall() async throws {
        let location = try await TestPostgres.freshDatabase()
        var logger = Logger(label: "test.history")
        logger.logLevel = .warning
        let key = try await PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { [logger] db in
            try await PostgresHistoryStore.tokenKey(db, logger: logger)
        }
        // One connection, so that every read below is planned and kept on the connection explained.
        try await TestPostgres.withDatabase(location, maximumConnections: 1, settings: PostgresHistoryStore.sessionSettings) { database in
            let store = PostgresHistoryStore(database: database, tokenKey: key, logger: logger)
            func run(_ sql: String) async throws -> [String] {
                try await database.connection { [logger] db in
                    var lines: [String] = []
                    for try await line in try await db.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String.self) { lines.append(line) }
                    return lines
                }
            }
            // Given a connection that read pages of every shape, counted and searched while the
            // tables held two items (analyzed then, and autovacuum off for them: an ANALYZE of the
            // grown tables would have the plans made again, and the test pass without the setting)
            _ = try await store.applyJobEvents([
                Events.job("a", user: "alice"), Events.job("b", user: "alice", createdAt: Events.epoch.addingTimeInterval(1)),
            ])
            for table in ["history_item", "history_item_count"] {
                _ = try await run("ALTER TABLE \(table) SET (autovacuum_enabled = false)")
                _ = try await run("ANALYZE \(table)")
            }
            let cursor = try #require(try await store.page(ListHistory(userId: "alice", limit: 1)).nextCursor)
            let statusCursor = try #require(try await store.page(ListHistory(userId: "alice", limit: 1, statuses: [.completed])).nextCursor)
            for _ in 0..<8 {
                #expect(try await store.page(ListHistory(userId: "alice", limit: 1)).items.map(\.jobId) == ["b"])
                #expect(try await store.page(ListHistory(userId: "alice", limit: 1, statuses: [.completed])).items.map(\.jobId) == ["b"])
                #expect(try await store.page(ListHistory(userId: "alice", limit: 1, cursor: cursor)).items.map(\.jobId) == ["a"])
                #expect(try await store.page(ListHistory(userId: "alice", limit: 1, cursor: statusCursor, statuses: [.completed])).items.map(\.jobId) == ["a"])
                #expect(try await store.renderedPage(ListHistory(userId: "alice", limit: 1)).count == 1)
                #expect(try await store.renderedPage(ListHistory(userId: "alice", limit: 1, statuses: [.completed])).count == 1)
                #expect(try await store.renderedPage(ListHistory(userId: "alice", limit: 1, cursor: cursor)).count == 1)
                #expect(try await store.renderedPage(ListHistory(userId: "alice", limit: 1, cursor: statusCursor, statuses: [.completed])).count == 1)
                #expect(try await store.page(ListHistory(userId: "alice", query: "SUNSET")).totalCount == 2)
                #expect(try await store.renderedPage(ListHistory(userId: "alice", query: "SUNSET")).totalCount == 2)
                #expect(try await store.page(ListHistory(userId: "alice", query: "no such words")).totalCount == 0)
            }
            // And tables that then grew: 3,000 items of alice's and 3,000 of a thousand others
            _ = try await run("""
                INSERT INTO history_item (job_id, user_id, effect_id, effect_title, prompt, status, progress, created_at, updated_at,
                    image_key, parameters, cost, version, change_sequence)
                SELECT 'job-' || lpad(g::text, 5, '0'), CASE WHEN g <= 3000 THEN 'alice' ELSE 'user-' || g % 1000 END, 'blur', 'Soft Focus',
                    'a field #' || g, CASE WHEN g % 3 = 0 THEN 'failed' ELSE 'completed' END, 1, 1764000000000 + g, 1764000000000 + g,
                    'uploads/x/' || g || '.jpg', '{}', 1, 1, g
                FROM generate_series(1, 6000) AS g
                """)
            _ = try await run("""
                INSERT INTO history_item_count (user_id, status, count) SELECT user_id, status, count(*) FROM history_item GROUP BY user_id, status
                ON CONFLICT (user_id, status) DO UPDATE SET count = excluded.count
                """)

            // When the plans kept for alice's reads are explained
            let plans = [
                "a page": #"EXECUTE "history_page_Top"('alice', 21, 0)"#,
                "a page by status": #"EXECUTE "history_page_TopByStatus"('alice', 21, 0, '{completed}')"#,
                "a page after a cursor": #"EXECUTE "history_page_After"('alice', 21, 0, 1764000001500, 'job-01500')"#,
                "a page by status after a cursor": #"EXECUTE "history_page_AfterByStatus"('alice', 21, 0, '{completed}', 1764000001500, 'job-01500')"#,
                "a page written from records": #"EXECUTE "history_rendered_page_Top"('alice', 21, 0)"#,
                "a page written from records, by status": #"EXECUTE "history_rendered_page_TopByStatus"('alice', 21, 0, '{completed}')"#,
                "a page written from records, after a cursor": #"EXECUTE "history_rendered_page_After"('alice', 21, 0, 1764000001500, 'job-01500')"#,
                "a page written from records, by status after a cursor":
                    #"EXECUTE "history_rendered_page_AfterByStatus"('alice', 21, 0, '{completed}', 1764000001500, 'job-01500')"#,
                "a search": #"EXECUTE history_search_scan('alice', '{}', '%field #12%', NULL, NULL, 21, 0, 10000)"#,
                "a search written from records": #"EXECUTE history_rendered_search_scan('alice', '{}', '%field #12%', NULL, NULL, 21, 0, 10000)"#,
                "a count": #"EXECUTE history_item_count_of_user('alice')"#,
            ]
            for (read, statement) in plans.sorted(by: { $0.key < $1.key }) {
                let plan = try await run("EXPLAIN (COSTS OFF) \(statement)").joined(separator: "\n")
                // Then none scans a table whole
                #expect(plan.contains("Index"), "\(read):\n\(plan)")
                #expect(!plan.contains("Seq Scan"), "\(read):\n\(plan)")
                // And a page is the index's own range, in its order
                if read.hasPrefix("a page") { #expect(!plan.contains("Sort"), "\(read):\n\(plan)") }
            }
            // And the reads still answer
            #expect(try await store.page(ListHistory(userId: "alice", limit: 5)).items.map(\.jobId) == ["job-03000", "job-02999", "job-02998", "job-02997", "job-02996"])
            #expect(try await store.page(ListHistory(userId: "alice", limit: 1)).totalCount == 3002)
            #expect(try await store.renderedPage(ListHistory(userId: "alice", limit: 1)).totalCount == 3002)
        }
    }
}
