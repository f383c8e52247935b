import Foundation
import JobsCore
@testable import JobsService
import Messages
import Storage
import Testing
import TestSupport

/// The dispatcher's lease on PostgreSQL, with two replicas' elections over one database.
@Suite("Dispatch election on PostgreSQL", .timeLimit(.minutes(5)))
struct DispatchElectionTests {
    func withElections<T>(ttl: Duration, _ body: (PostgresJobsStore, DispatchElection, DispatchElection) async throws -> T) async throws -> T {
        let location = try await TestPostgres.freshDatabase()
        try await PostgresPool.migrate(location, service: "jobs", PostgresJobsStore.migrations, logger: quietLogger)
        return try await TestPostgres.withDatabase(location) { database in
            try await body(
                PostgresJobsStore(database: database, logger: quietLogger),
                DispatchElection(database: database, holder: "replica-a", ttl: ttl, logger: quietLogger),
                DispatchElection(database: database, holder: "replica-b", ttl: ttl, logger: quietLogger)
            )
        }
    }

    @Test func oneReplicaHoldsTheLeaseUntilItLapsesThenTheOtherTakesItWithAHigherTerm() async throws {
        // A lease long enough that a slow machine renews or reads it before it lapses by itself.
        try await withElections(ttl: .seconds(3)) { _, a, b in
            // Given A took the lease
            let first = try #require(try await a.claim())
            // Then B cannot take it while A renews, and A keeps its term
            #expect(try await b.claim() == nil)
            #expect(try await a.claim() == first)
            // When A stops renewing, B takes it once it lapses, under a higher term
            let deadline = ContinuousClock.now + .seconds(15)
            var taken: Int64?
            while taken == nil, ContinuousClock.now < deadline {
                taken = try await b.claim()
                if taken == nil { try await Task.sleep(for: .milliseconds(50)) }
            }
            let second = try #require(taken)
            #expect(second > first)
            // And A, back, finds it held
            #expect(try await a.claim() == nil)
            // And a resignation hands it over at once
            await b.resign()
            #expect(try await a.claim() == second + 1)
        }
    }

    @Test func aDeposedLeadersWritesChangeNothing() async throws {
        try await withElections(ttl: .milliseconds(200)) { store, a, b in
            // Given a job created (by any replica), and A leading under its term
            let job = try await store.create(
                CreateJob(jobId: "fenced", userId: "alice", isPro: false, imageKey: "uploads/alice/a.jpg", effectId: "copy"),
                effectId: "copy", parameters: [:], now: Date()
            ).job
            let termA = try #require(try await a.claim())
            let leaderA = store.fenced(.init(holder: a.holder, term: termA))
            let started = try #require(try await leaderA.start(job.id, now: Date()))
            #expect(started.status == .processing)
            // When B takes over after A's lease lapsed
            try await Task.sleep(for: .milliseconds(300))
            let termB = try #require(try await b.claim())
            let leaderB = store.fenced(.init(holder: b.holder, term: termB))
            // Then A's late writes are refused and change nothing
            await #expect(throws: DispatchDeposed.self) {
                _ = try await leaderA.complete(JobAttempt(jobId: job.id, attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: Date())
            }
            await #expect(throws: DispatchDeposed.self) { _ = try await leaderA.requeue(JobAttempt(jobId: job.id, attempt: 1), reason: "late", now: Date()) }
            // And so is its batch of one event's starts and results, every write of it
            let queued = try await store.create(
                CreateJob(jobId: "queued", userId: "alice", isPro: false, imageKey: "uploads/alice/a.jpg", effectId: "copy"),
                effectId: "copy", parameters: [:], now: Date()
            ).job
            let late = await leaderA.write(
                starts: [queued.id], results: [(JobAttempt(jobId: job.id, attempt: 1), .done(JobOutput(resultKey: "r", thumbnailKey: "t")))], now: Date()
            )
            for written in late.starts.map({ $0.map { _ in () } }) + late.results.map({ $0.map { _ in () } }) {
                #expect(throws: DispatchDeposed.self) { try written.get() }
            }
            #expect(try await store.job(queued.id, userId: nil)?.status == .queued)
            #expect(try await store.job(job.id, userId: nil)?.status == .processing)
            // And B's are applied
            let outcome = try await leaderB.complete(JobAttempt(jobId: job.id, attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: Date())
            guard case .applied(let done) = outcome else { Issue.record("the leader's write was refused: \(outcome)"); return }
            #expect(done.status == .completed)
        }
    }
}
