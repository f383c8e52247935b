import Foundation
import GRDB
@testable import HistoryService
import Messages
import Testing

/// The item table's move to a layout clustered by (user, created, job) keeps an existing
/// database whole: its items, their order, their search entries and their ids.
@Suite("History's item table migrated", .timeLimit(.minutes(2)))
struct HistoryMigrationTests {
    @Test func aDatabaseOfTheFirstLayoutKeepsItsItemsSearchAndIdsAfterTheMigration() async throws {
        var configuration = Configuration()
        configuration.prepareDatabase(HistoryDatabase.prepare)
        let queue = try DatabaseQueue(configuration: configuration)
        // Given a database in the first layout, with items of two users written as it wrote them
        try HistoryDatabase.migrator.migrate(queue, upTo: "v1: items, search, changes, shares, purges")
        try await queue.write { db in
            for (index, (user, prompt)) in [("u1", "a sunset over the sea"), ("u2", "a red bicycle"), ("u1", "mountains at dawn"), ("u1", "the sea at night")].enumerated() {
                try db.execute(sql: """
                    INSERT INTO item (userId, effectId, effectTitle, prompt, status, progress, createdAt, updatedAt, resultKey, thumbnailKey,
                        imageKey, parameters, cost, version, changeSequence, jobId)
                    VALUES (?, 'blur', 'Soft Focus', ?, 'completed', 1, ?, ?, 'results/r.jpg', 'thumbnails/t.jpg', 'uploads/u.jpg', '{}', 1, 1, ?, ?)
                    """, arguments: [user, prompt, 1_764_000_000_000 + index * 60_000, 1_764_000_000_000 + index * 60_000, index + 1, "job-\(index)"])
                try db.execute(sql: "INSERT INTO item_count (userId, status, count) VALUES (?, 'completed', 1) ON CONFLICT (userId, status) DO UPDATE SET count = count + 1",
                               arguments: [user])
            }
            try db.execute(sql: "UPDATE meta SET value = 4 WHERE key = 'changeSequence'")
        }
        let idsBefore = try await queue.read { db in try Row.fetchAll(db, sql: "SELECT jobId, id FROM item ORDER BY jobId").map { "\($0[0] as String)=\($0[1] as Int64)" } }

        // When the service opens it (the migration runs)
        let database = try HistoryDatabase(queue, scanUpTo: 0)
        let layout = try await queue.read { db in try String.fetchOne(db, sql: "SELECT sql FROM sqlite_master WHERE name = 'item'") ?? "" }
        #expect(layout.contains("WITHOUT ROWID") && layout.contains("PRIMARY KEY (userId, createdAt, jobId)"))
        #expect(try await queue.read { db in try Row.fetchAll(db, sql: "SELECT jobId, id FROM item ORDER BY jobId").map { "\($0[0] as String)=\($0[1] as Int64)" } } == idsBefore)

        // Then pages, search (through the kept index) and single items read as before
        #expect(try await database.page(ListHistory(userId: "u1")).items.map(\.jobId) == ["job-3", "job-2", "job-0"])
        #expect(try await database.page(ListHistory(userId: "u1", query: "sea")).items.map(\.jobId) == ["job-3", "job-0"])
        #expect(try await database.page(ListHistory(userId: "u2", query: "bicycle")).items.map(\.jobId) == ["job-1"])
        #expect(try await database.item("job-2", userId: "u1")?.prompt == "mountains at dawn")
        // And a new item gets the next id, and is found by search
        #expect(try await database.applyJobEvents([Events.job("job-4", prompt: "a quiet sea", createdAt: Date(timeIntervalSince1970: 1_764_001_000))]) == 1)
        #expect(try await queue.read { db in try Int64.fetchOne(db, sql: "SELECT id FROM item WHERE jobId = 'job-4'") } == 5)
        #expect(try await database.page(ListHistory(userId: "u1", query: "sea")).items.map(\.jobId) == ["job-4", "job-3", "job-0"])
        // And a deleted item leaves the search index too
        _ = try await database.deleteItem("job-3", userId: "u1", now: Date())
        #expect(try await database.page(ListHistory(userId: "u1", query: "sea")).items.map(\.jobId) == ["job-4", "job-0"])
        #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 3)
    }
}
