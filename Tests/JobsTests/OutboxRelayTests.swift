import Foundation
import GRDB
import JobsCore
@testable import JobsService
import Messages
import ServiceKit
import Synchronization
import Testing

/// The one outbox relay, over the jobs database's real outbox (in memory): what is delivered
/// leaves, what must wait is put back with the one backoff, what was not reached stays as it was.
@Suite("Outbox relay", .timeLimit(.minutes(5)))
struct OutboxRelayTests {
    let store = SQLiteJobsStore(database: try! JobsDatabase.inMemory(), retry: RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10)), effectTitles: [:])
    let now = Date()

    /// Three completed jobs: three `commit` settlements in the outbox.
    func threeSettlements() async throws {
        for id in ["a", "b", "c"] {
            _ = try await store.create(CreateJob(jobId: id, userId: "u", isPro: false, imageKey: "uploads/u/x.jpg", effectId: "copy"), effectId: "copy", parameters: [:], now: now)
            let started = try #require(try await store.start(id, now: now))
            _ = try await store.complete(JobAttempt(jobId: id, attempt: started.attempts), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
        }
    }

    func settlements() async throws -> [(jobId: String, attempts: Int)] {
        try await store.database.read {
            try Row.fetchAll($0, sql: "SELECT jobId, attempts FROM outbox WHERE topic = 'quota' ORDER BY id").map { ($0["jobId"], $0["attempts"]) }
        }
    }

    @Test func aFailureIsRetriedAfterItsBackoffAndTheEntriesNotReachedWait() async throws {
        try await threeSettlements()
        // A receiver that is down for its first call
        let calls = Mutex<[String]>([])
        let relay = OutboxRelay("settlements", outbox: JobsOutbox(database: store.database, topic: OutboxEntry.Topic.quota), logger: .init(label: "test")) { items in
            await OutboxDeliveries.oneByOne(items) { item in
                guard case .settlement(.commit) = item.kind else { return .delivered }
                let first = calls.withLock { calls in
                    calls.append(item.jobId)
                    return calls.count == 1
                }
                return first ? .retry : .delivered
            }
        }
        // The first round stops at the failure: a waits 1 s, b and c were not tried
        #expect(try await relay.relayDue(now: now) == (delivered: 0, retried: 1))
        #expect(try await settlements().map(\.attempts) == [1, 0, 0])
        // At once, a is not due: b and c go
        #expect(try await relay.relayDue(now: now) == (delivered: 2, retried: 0))
        #expect(try await settlements().map(\.jobId) == ["a"])
        #expect(try await relay.relayDue(now: now.addingTimeInterval(0.9)) == (delivered: 0, retried: 0))
        // After its backoff, a goes too, and the outbox is empty
        #expect(try await relay.relayDue(now: now.addingTimeInterval(1)) == (delivered: 1, retried: 0))
        #expect(try await settlements().isEmpty)
        #expect(calls.withLock { $0 } == ["a", "b", "c", "a"])
    }

    @Test func theBackoffDoublesFromOneSecondToThirty() {
        #expect((1...8).map { OutboxBackoff.delay(afterAttempts: $0) } == [1, 2, 4, 8, 16, 30, 30, 30])
        #expect(OutboxBackoff.delay(afterAttempts: 10_000) == 30)
    }

    @Test func anEntryThisVersionCannotReadIsNamedAsSuch() async throws {
        try await store.database.write { db in
            try db.execute(sql: """
                INSERT INTO outbox (topic, kind, jobId, version, payload, createdAt, attempts, nextAttemptAt)
                VALUES ('quota', 'refund', 'x', 1, NULL, '2020-01-01 00:00:00.000', 0, '2020-01-01 00:00:00.000')
                """)
        }
        let due = try await JobsOutbox(database: store.database, topic: OutboxEntry.Topic.quota).due(now: now, limit: 10)
        #expect(due.map(\.kind) == [.unreadable("settlement refund")])
    }
}
