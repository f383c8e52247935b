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

@Suite("Quota over the bus, in process")
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
        let committer = GroupCommitter(writer: database.writer)
        let ledger = QuotaLedger()
        let now = Date()
        async let good = committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u", jobId: "a"), now: now) }
        async let bad = Result(catching: { try await committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u", jobId: "b", cost: 0), now: now) } })
        async let alsoGood = committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u", jobId: "c"), now: now) }
        #expect(try await good.admitted)
        #expect(try await alsoGood.admitted)
        if case .success = await bad { Issue.record("a zero-cost reserve succeeded") }
        let status = try await database.writer.read { try ledger.status($0, user: "u", now: now) }
        #expect(status.daily.used == 2)
    }
}

@Suite("Group commit")
struct GroupCommitterTests {
    @Test func manyWritesAtOnceShareFewTransactions() async throws {
        let (database, folder) = try temporaryDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let committer = GroupCommitter(writer: database.writer)
        let ledger = QuotaLedger()
        let now = Date()
        // 500 reserves of 500 users, submitted together
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<500 {
                group.addTask { try await committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u\(index)", jobId: "j\(index)"), now: now) }.admitted }
            }
            for try await admitted in group { #expect(admitted) }
        }
        let statistics = committer.statistics
        #expect(statistics.works == 500)
        #expect(statistics.transactions < 100, "500 writes took \(statistics.transactions) transactions")
        #expect(statistics.savepointRetries == 0)
        let charges = try await database.writer.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM charge") }
        #expect(charges == 500)
    }

    @Test func workThatFailsAfterWritingIsRolledBackAloneAndTheRestCommits() async throws {
        let (database, folder) = try temporaryDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        let committer = GroupCommitter(writer: database.writer)
        let ledger = QuotaLedger()
        let now = Date()
        struct Late: Error {}
        // Reserves around one piece of work that writes a charge and then throws
        async let first = committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u", jobId: "a"), now: now) }
        async let halfDone = Result(catching: {
            try await committer.perform { db -> Int in
                _ = try ledger.reserve(db, ReserveQuota(userId: "u", jobId: "half"), now: now)
                throw Late()
            }
        })
        async let last = committer.perform { try ledger.reserve($0, ReserveQuota(userId: "u", jobId: "c"), now: now) }
        #expect(try await first.admitted)
        #expect(try await last.admitted)
        guard case .failure(let error) = await halfDone, error is Late else {
            Issue.record("the failing work did not fail with its own error")
            return
        }
        // Then its charge is gone and the other two are counted once each
        let status = try await database.writer.read { try ledger.status($0, user: "u", now: now) }
        #expect(status.daily.used == 2)
        let jobs = try await database.writer.read { try String.fetchAll($0, sql: "SELECT jobId FROM charge ORDER BY jobId") }
        #expect(jobs == ["a", "c"])
        #expect(committer.statistics.savepointRetries == 1)
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
