import Bus
import Foundation
import GRDB
import Logging
import Messages
import QuotaCore
@testable import QuotaService
import Storage
import Synchronization
import Dispatch
import Testing
import TestSupport
import Threads

/// A quota database in a fresh temporary folder (removed by the caller), as the service opens it.
func temporaryDatabase() throws -> (QuotaDatabase, URL) {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("quota-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    return (try QuotaDatabase.open(path: folder.appendingPathComponent("quota.sqlite").path), folder)
}

@Suite("Quota over the bus, in process", .timeLimit(.minutes(5)))
struct QuotaHandlerTests {
    func context() -> BusRequestContext {
        BusRequestContext(method: "test", traceId: "", deadlineMilliseconds: .max, logger: Logger(label: "test"))
    }

    @Test func concurrentReservesCommittedTogetherAdmitExactlyTheRemaining() async throws {
        // Given a free user with 20 left today, on a real database file
        let (database, folder) = try temporaryDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        var router = BusRouter()
        QuotaHandler(store: database, plans: .standard).register(on: &router)
        // When 200 reserves arrive at once
        let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<200 {
                group.addTask { [router] in
                    try await router.call(Quota.reserve, ReserveQuota(userId: "burst", jobId: "job-\(index)"), context: context()).admitted
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        // Then exactly 20 are admitted, and the ledger agrees
        #expect(admitted == 20)
        let usage = try await router.call(Quota.usage, UserReference(userId: "burst"), context: context())
        #expect(usage.status.daily.used == 20)
        #expect(usage.charges.count == 20)
    }

    @Test func oneBadRequestInABatchDoesNotSpoilTheOthers() async throws {
        let (database, folder) = try temporaryDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let now = Date()
        // Three reserves decided in one batch, the middle one malformed
        async let good = database.reserve(ReserveQuota(userId: "u", jobId: "a"), now: now)
        async let bad = Result(catching: { try await database.reserve(ReserveQuota(userId: "u", jobId: "b", cost: 0), now: now) })
        async let alsoGood = database.reserve(ReserveQuota(userId: "u", jobId: "c"), now: now)
        #expect(try await good.admitted)
        #expect(try await alsoGood.admitted)
        if case .success = await bad { Issue.record("a zero-cost reserve succeeded") }
        #expect(try await database.status(userId: "u", now: now).daily.used == 2)
    }
}

/// A database file with one table of items, as `DurableDatabase` opens every service's.
private func itemsDatabase() throws -> (DatabasePool, URL) {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("commit-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    let pool = try DurableDatabase.open(path: folder.appendingPathComponent("items.sqlite").path)
    try pool.write { try $0.execute(sql: "CREATE TABLE item (id TEXT PRIMARY KEY, owner TEXT NOT NULL)") }
    return (pool, folder)
}

@Suite("Group commit", .timeLimit(.minutes(5)))
struct GroupCommitterTests {
    @Test func manyWritesAtOnceShareFewTransactions() async throws {
        let (pool, folder) = try itemsDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let committer = GroupCommitter(writer: pool)
        // 500 inserts, submitted together
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<500 {
                group.addTask {
                    try await committer.perform { try $0.execute(sql: "INSERT INTO item (id, owner) VALUES (?, 'u')", arguments: ["j\(index)"]) }
                }
            }
            try await group.waitForAll()
        }
        let statistics = committer.statistics
        #expect(statistics.works == 500)
        #expect(statistics.transactions < 100, "500 writes took \(statistics.transactions) transactions")
        #expect(statistics.savepointRetries == 0)
        #expect(try await pool.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM item") } == 500)
    }

    @Test func workThatFailsAfterWritingIsRolledBackAloneAndTheRestCommits() async throws {
        let (pool, folder) = try itemsDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let committer = GroupCommitter(writer: pool)
        struct Late: Error {}
        @Sendable func insert(_ id: String) -> @Sendable (Database) throws -> Void {
            { try $0.execute(sql: "INSERT INTO item (id, owner) VALUES (?, 'u')", arguments: [id]) }
        }
        // Inserts around one piece of work that writes a row and then throws
        async let first: Void = committer.perform(insert("a"))
        async let halfDone = Result(catching: {
            try await committer.perform { db -> Int in
                try insert("half")(db)
                throw Late()
            }
        })
        async let last: Void = committer.perform(insert("c"))
        try await first
        try await last
        guard case .failure(let error) = await halfDone, error is Late else {
            Issue.record("the failing work did not fail with its own error")
            return
        }
        // Then its row is gone and the other two are there once each
        #expect(try await pool.read { try String.fetchAll($0, sql: "SELECT id FROM item ORDER BY id") } == ["a", "c"])
        #expect(committer.statistics.savepointRetries == 1)
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

@Suite("The batch thread", .timeLimit(.minutes(2)))
struct BatchThreadTests {
    /// An item that says when it was handled.
    struct Item: Sendable {
        var value: Int
        var done: @Sendable () -> Void
    }

    @Test func closeAnswersWhatIsQueuedThenRefusesAndTheThreadEnds() async throws {
        let handled = Mutex<[Int]>([])
        // A handler slow enough that items queue behind the first batch
        let thread = BatchThread<Item>(name: "test-batch", maxBatch: 4, maxQueued: 8) { batch in
            Thread.sleep(forTimeInterval: 0.05)
            handled.withLock { $0 += batch.map(\.value) }
            for item in batch { item.done() }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for value in 0..<8 {
                group.addTask {
                    await withCheckedContinuation { continuation in
                        #expect(thread.submit(Item(value: value, done: { continuation.resume() })) == nil)
                    }
                }
            }
            try await waitUntil { thread.isRunning }
            await thread.close()
            // Closed: nothing more is queued, the thread has ended and everything queued was handled
            #expect(!thread.isRunning)
            #expect(thread.submit(Item(value: 99, done: {})) == .closed)
            try await group.waitForAll()
        }
        #expect(handled.withLock { $0.sorted() } == Array(0..<8))
        #expect(thread.batches >= 2, "8 items in batches of at most 4")
    }

    @Test func pastMaxQueuedAnItemIsRefusedAndTheThreadEndsWhenIdle() async throws {
        let gate = DispatchSemaphore(value: 0)
        let thread = BatchThread<Item>(name: "test-batch", maxBatch: 1, maxQueued: 2, idleTimeout: .milliseconds(50)) { batch in
            gate.wait()
            for item in batch { item.done() }
        }
        let answered = Atomic<Int>(0)
        let done: @Sendable () -> Void = { answered.add(1, ordering: .relaxed) }
        #expect(thread.submit(Item(value: 1, done: done)) == nil)
        // The first is taken by the thread (blocked in the handler); two more fill the queue
        try await waitUntil { thread.batches == 1 }
        #expect(thread.submit(Item(value: 2, done: done)) == nil)
        #expect(thread.submit(Item(value: 3, done: done)) == nil)
        #expect(thread.submit(Item(value: 4, done: done)) == .full)
        for _ in 0..<3 { gate.signal() }
        try await waitUntil { answered.load(ordering: .relaxed) == 3 }
        // Idle past its timeout: the thread ends, and the next item starts it again
        try await waitUntil { !thread.isRunning }
        gate.signal()
        #expect(thread.submit(Item(value: 5, done: done)) == nil)
        try await waitUntil { answered.load(ordering: .relaxed) == 4 }
    }

    @Test func aClosedCommitterRefusesWorkAfterCommittingWhatItAccepted() async throws {
        let (pool, folder) = try itemsDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let committer = GroupCommitter(writer: pool)
        try await committer.perform { try $0.execute(sql: "INSERT INTO item (id, owner) VALUES ('a', 'u')") }
        await committer.close()
        await #expect(throws: BusError.self) {
            try await committer.perform { try $0.execute(sql: "INSERT INTO item (id, owner) VALUES ('b', 'u')") }
        }
        #expect(try await pool.read { try String.fetchAll($0, sql: "SELECT id FROM item") } == ["a"])
    }
}
