import Foundation
import HistoryService
import Messages
import Testing

@Suite("History changes feed", .timeLimit(.minutes(5)))
struct HistoryChangesTests {
    @Test(arguments: HistoryBackend.allCases) func changesSinceATokenIncludeUpsertsAndDeletions(backend: HistoryBackend) async throws {
        // Given a client that has caught up
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("a"), Events.job("b", status: .processing)])
            let start = try await database.changes(ChangesSince(userId: "u1"))
            #expect(start.changes.map(\.op) == [.upsert, .upsert])
            // When one item completes and another is deleted
            _ = try await database.applyJobEvents([Events.job("b", status: .completed, version: 2)])
            _ = try await database.deleteItem("a", userId: "u1", now: Date())
            // Then the feed since the token says exactly that, in order
            let since = try await database.changes(ChangesSince(userId: "u1", token: start.nextToken))
            #expect(since.changes.count == 2)
            #expect(since.changes[0].op == .upsert && since.changes[0].item?.status == .completed)
            #expect(since.changes[1].op == .delete && since.changes[1].id == "a")
            #expect(try await database.changes(ChangesSince(userId: "u1", token: since.nextToken)).changes.isEmpty)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func theFeedPagesWithHasMore(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents((0..<5).map { Events.job("j\($0)") })
            let first = try await database.changes(ChangesSince(userId: "u1", limit: 3))
            #expect(first.changes.count == 3 && first.hasMore)
            let second = try await database.changes(ChangesSince(userId: "u1", token: first.nextToken, limit: 3))
            #expect(second.changes.count == 2 && !second.hasMore)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aTokenOlderThanTheKeptDeletionsExpires(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("a"), Events.job("b")])
            let token = try await database.changes(ChangesSince(userId: "u1")).nextToken
            let deletedAt = Date()
            _ = try await database.deleteItem("a", userId: "u1", now: deletedAt)
            try await database.purges.acknowledge(["a"])
            #expect(try await database.pruneTombstones(before: deletedAt.addingTimeInterval(1), now: deletedAt, limit: 100) == 1)
            await #expect(throws: BusError(History.ErrorCode.tokenExpired, "deletions this old are no longer kept: list the history again")) {
                _ = try await database.changes(ChangesSince(userId: "u1", token: token))
            }
            // Listing from the beginning still works.
            #expect(try await database.changes(ChangesSince(userId: "u1")).changes.map(\.item?.jobId) == ["b"])
        }
    }

    @Test(arguments: HistoryBackend.allCases) func anotherUsersTokenIsRefused(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("a")])
            let token = try await database.changes(ChangesSince(userId: "u1")).nextToken
            await #expect(throws: BusError.self) { _ = try await database.changes(ChangesSince(userId: "u2", token: token)) }
        }
    }
}
