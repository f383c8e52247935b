import Bus
import Foundation
import GRDB
import Logging
import Messages
import QuotaCore
@testable import QuotaService
import Storage
import Testing

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
