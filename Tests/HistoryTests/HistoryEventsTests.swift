import Foundation
import HistoryService
import Messages
import ServiceKit
import Testing

/// Events for tests: a job as jobs would emit it at a version.
enum Events {
    static let epoch = Date(timeIntervalSince1970: 1_764_000_000)  // 2025-11-24T16:00:00Z

    static func job(
        _ id: String, user: String = "u1", status: JobStatus = .completed, version: Int = 1, prompt: String? = "a sunset over the sea",
        createdAt: Date = epoch, effectId: String = "blur", imageKey: String = "uploads/x/original.jpg"
    ) -> JobEvent {
        JobEvent(
            job: JobRecord(
                id: id, userId: user, isPro: false, imageKey: imageKey, effectId: effectId, parameters: ["sigma": 2], prompt: prompt,
                status: status, progress: status == .completed ? 1 : 0, attempts: 1, maxAttempts: 3, lastError: status == .failed ? "boom" : nil,
                resultKey: status == .completed ? "results/\(id)/1.jpg" : nil, thumbnailKey: status == .completed ? "thumbnails/\(id)/1.jpg" : nil,
                createdAt: createdAt, updatedAt: createdAt, startedAt: nil, finishedAt: nil, version: version
            ),
            effectTitle: effectId == "blur" ? "Soft Focus" : effectId
        )
    }
}

@Suite("History events", .timeLimit(.minutes(5)))
struct HistoryEventsTests {
    @Test(arguments: HistoryBackend.allCases) func anItemsParametersAreKeptExactly(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            // Given edits with several parameters (fractions, a negative, a tiny one, a key to
            // escape) and with none
            var event = Events.job("p1")
            let parameters: [String: Double] = ["sigma": 2, "amount": 0.35, "shift": -12.5, "tiny": 1e-7, "quote\"d": 3]
            event.job.parameters = parameters
            var bare = Events.job("p2")
            bare.job.parameters = [:]
            _ = try await database.applyJobEvents([event, bare])
            // Then each item reads back the parameters it was created with
            #expect(try await database.item("p1", userId: "u1")?.parameters == parameters)
            #expect(try await database.item("p2", userId: "u1")?.parameters == [:])
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aReplayedEventChangesNothing(backend: HistoryBackend) async throws {
        // Given an item at version 2
        try await withHistoryStore(backend) { database in
            #expect(try await database.applyJobEvents([Events.job("j1", status: .queued, version: 1), Events.job("j1", status: .processing, version: 2)]) == 2)
            // When both events arrive again
            let applied = try await database.applyJobEvents([Events.job("j1", status: .queued, version: 1), Events.job("j1", status: .processing, version: 2)])
            // Then nothing changed
            #expect(applied == 0)
            #expect(try await database.item("j1", userId: "u1")?.status == .processing)
            #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 1)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func oneDeliveryOfManyUsersAndVersionsAppliesAsOneEventAtATimeWould(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { (database: any HistoryStore) async throws in
            // Given a delivery mixing users, a job's versions out of order, and a new job
            let delivery = [
                Events.job("a", user: "u1", status: .queued, version: 1),
                Events.job("b", user: "u2", status: .processing, version: 2),
                Events.job("a", user: "u1", status: .completed, version: 3),
                Events.job("a", user: "u1", status: .processing, version: 2),  // older than 3: nothing
                Events.job("c", user: "u1", status: .failed, version: 4),
                Events.job("b", user: "u2", status: .processing, version: 2),  // the same again: nothing
            ]
            // Then four events apply, each item at its newest version
            #expect(try await database.applyJobEvents(delivery) == 4)
            #expect(try await database.item("a", userId: "u1")?.status == .completed)
            #expect(try await database.item("a", userId: "u1")?.version == 3)
            #expect(try await database.item("b", userId: "u2")?.status == .processing)
            // And the counts and pages agree with the items
            #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 2)
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.completed])).totalCount == 1)
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.processing])).totalCount == 0)
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.failed])).items.map(\.jobId) == ["c"])
            #expect(try await database.page(ListHistory(userId: "u2")).totalCount == 1)
            // And the changes feed lists each user's items in the order they last changed
            #expect(try await database.changes(ChangesSince(userId: "u1")).changes.compactMap(\.item?.jobId) == ["a", "c"])
        }
    }

    @Test(arguments: HistoryBackend.allCases) func anOlderVersionNeverOverwritesANewerOne(backend: HistoryBackend) async throws {
        // Given a completed item at version 3
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("j1", status: .completed, version: 3)])
            // When the queued (1) and processing (2) events arrive late, out of order
            let applied = try await database.applyJobEvents([Events.job("j1", status: .processing, version: 2), Events.job("j1", status: .queued, version: 1)])
            // Then the item stays completed
            #expect(applied == 0)
            let item = try #require(try await database.item("j1", userId: "u1"))
            #expect(item.status == .completed && item.version == 3 && item.resultKey == "results/j1/1.jpg")
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.completed])).totalCount == 1)
            #expect(try await database.page(ListHistory(userId: "u1", statuses: [.processing])).totalCount == 0)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aDeletedJobStaysDeletedWhenALateEventArrives(backend: HistoryBackend) async throws {
        // Given a deleted item
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("j1", status: .processing, version: 2)])
            #expect(try await database.deleteItem("j1", userId: "u1", now: Date()) != nil)
            // When an event of the same job arrives afterwards
            let applied = try await database.applyJobEvents([Events.job("j1", status: .completed, version: 3)])
            // Then it does not come back
            #expect(applied == 0)
            #expect(try await database.item("j1", userId: "u1") == nil)
            #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 0)
        }
    }

    @Test(arguments: HistoryBackend.allCases) func someoneElsesItemIsNotFoundAndCannotBeDeleted(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("j1", user: "alice")])
            #expect(try await database.item("j1", userId: "bob") == nil)
            #expect(try await database.deleteItem("j1", userId: "bob", now: Date()) == nil)
            #expect(try await database.item("j1", userId: "alice") != nil)
        }
    }

    /// An event updates its item in place, unless it names another creation time or user for the
    /// job (SQLite's update then moves the row, which it otherwise leaves where it is).
    @Test(arguments: HistoryBackend.allCases) func aJobSeenUnderAnotherCreationTimeOrUserMovesItsItem(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            // Given two items of alice's
            let earlier = Events.epoch.addingTimeInterval(-60), earliest = Events.epoch.addingTimeInterval(-120)
            _ = try await database.applyJobEvents([
                Events.job("old", user: "alice", createdAt: earlier), Events.job("j1", user: "alice", status: .processing, version: 1),
            ])
            // When a later event of j1 moves it back in time
            _ = try await database.applyJobEvents([Events.job("j1", user: "alice", status: .processing, version: 2, createdAt: earliest)])
            // Then her page lists it after the other, at its new time
            let moved = try await database.page(ListHistory(userId: "alice"))
            #expect(moved.items.map(\.jobId) == ["old", "j1"])
            #expect(moved.items.last?.createdAt == earliest)
            // And when the next names another user, it is theirs alone, counted once
            _ = try await database.applyJobEvents([Events.job("j1", user: "bob", status: .completed, version: 3, createdAt: earliest)])
            let alices = try await database.page(ListHistory(userId: "alice")), bobs = try await database.page(ListHistory(userId: "bob"))
            #expect(alices.items.map(\.jobId) == ["old"] && alices.totalCount == 1)
            #expect(bobs.items.map(\.jobId) == ["j1"] && bobs.totalCount == 1 && bobs.items.first?.status == .completed)
            #expect(try await database.item("j1", userId: "alice") == nil)
            // And an ordinary event after that updates it where it is
            _ = try await database.applyJobEvents([Events.job("j1", user: "bob", status: .completed, version: 4, prompt: "a new prompt", createdAt: earliest)])
            #expect(try await database.item("j1", userId: "bob")?.prompt == "a new prompt")
            #expect(try await database.page(ListHistory(userId: "bob", query: "new prompt")).items.map(\.jobId) == ["j1"])
        }
    }

    @Test(arguments: HistoryBackend.allCases) func aDeleteQueuesOnePurgeForJobs(backend: HistoryBackend) async throws {
        try await withHistoryStore(backend) { database in
            _ = try await database.applyJobEvents([Events.job("j1"), Events.job("j2")])
            _ = try await database.deleteItem("j1", userId: "u1", now: Date())
            // Sent again (its answer lost), the delete is answered as the first was, and queues
            // nothing more; another user's delete of it is still an unknown id
            #expect(try await database.deleteItem("j1", userId: "u1", now: Date()) == DeletedHistoryItem(jobId: "j1"))
            #expect(try await database.deleteItem("j1", userId: "bob", now: Date()) == nil)
            let now = Date()
            let due = try await database.purges.due(now: now.addingTimeInterval(1), limit: 10)
            #expect(due.map(\.jobId) == ["j1"])
            // A purge jobs did not take waits its turn, its attempts counted
            _ = try await database.deleteItem("j2", userId: "u1", now: now)
            try await database.purges.retry([
                OutboxRetry(id: "j1", attempts: 2, at: now.addingTimeInterval(60)), OutboxRetry(id: "j2", attempts: 1, at: now.addingTimeInterval(30)),
            ])
            #expect(try await database.purges.due(now: now.addingTimeInterval(20), limit: 10).isEmpty)
            #expect(try await database.purges.due(now: now.addingTimeInterval(40), limit: 10).map { "\($0.jobId) \($0.attempts)" } == ["j2 1"])
            let both = try await database.purges.due(now: now.addingTimeInterval(70), limit: 10)
            #expect(both.map { "\($0.jobId) \($0.attempts)" } == ["j2 1", "j1 2"])
            try await database.purges.acknowledge(both.map(\.id))
            #expect(try await database.pendingPurgeCount() == 0)
        }
    }
}

@Suite("History's database file", .timeLimit(.minutes(5)))
struct HistoryDatabaseFileTests {
    @Test func itsLogIsCopiedIntoTheDatabaseFileInTheBackgroundNotInsideTheCommitsThatApplyEvents() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("history-wal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("history.sqlite").path
        let database = try HistoryDatabase.open(path: path)
        let size = { (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0 }
        let before = size()
        // Given 1,000 jobs' events applied, about 2 MB of log: less than SQLite's automatic
        // checkpoint inside a commit waits for (1,000 pages, 4 MB)
        for batch in 0..<5 {
            let events = (0..<200).map { index in
                Events.job("j-\(batch)-\(index)", user: "u\(index % 50)", prompt: String(repeating: "a long prompt ", count: 40))
            }
            #expect(try await database.applyJobEvents(events) == 200)
        }
        // Then the database file grows to hold them: copied from the log by the checkpointer
        let deadline = ContinuousClock.now.advanced(by: .seconds(10))
        while size() < before + 1_000_000, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let log = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
        #expect(size() >= before + 1_000_000, "the database file is \(size()) bytes, \(before) before; the log \(log)")
        #expect(try await database.page(ListHistory(userId: "u1")).totalCount == 20)
    }
}
