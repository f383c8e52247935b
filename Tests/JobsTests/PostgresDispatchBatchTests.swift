import Foundation
import JobsCore
@testable import JobsService
import Messages
import PostgresNIO
import Storage
import Testing
import TestSupport

/// The dispatcher's writes of one event on PostgreSQL: its starts and workers' results in one
/// transaction, each decided as it would be alone.
@Suite("Dispatch batches on PostgreSQL", .timeLimit(.minutes(5)))
struct PostgresDispatchBatchTests {
    let now = Date(timeIntervalSince1970: 1_790_000_000.25)

    func withStore<T>(_ body: (PostgresJobsStore, PostgresPool) async throws -> T) async throws -> T {
        let location = try await TestPostgres.freshDatabase()
        try await PostgresPool.migrate(location, service: "jobs", PostgresJobsStore.migrations, logger: quietLogger)
        return try await TestPostgres.withDatabase(location) { database in
            try await body(PostgresJobsStore(database: database, retry: RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10)), logger: quietLogger), database)
        }
    }

    func create(_ store: PostgresJobsStore, _ id: String) async throws {
        _ = try await store.create(
            CreateJob(jobId: id, userId: "alice", isPro: false, imageKey: "uploads/alice/\(id).jpg", effectId: "copy"), effectId: "copy", parameters: [:], now: now
        )
    }

    /// The transaction ids that last wrote these jobs' rows and the outbox's entries for them
    /// (PostgreSQL's `xmin`): one id, one transaction.
    func writers(_ database: PostgresPool, jobs ids: [String]) async throws -> (jobs: Set<String>, outbox: Set<String>) {
        try await database.connection { db in
            (Set(try await db.all("SELECT xmin::text FROM jobs_job WHERE id = ANY(\(ids)::text[])", as: String.self, logger: quietLogger)),
             Set(try await db.all("SELECT xmin::text FROM jobs_outbox WHERE job_id = ANY(\(ids)::text[])", as: String.self, logger: quietLogger)))
        }
    }

    @Test func startsAndResultsOfOneEventAreOneTransactionEachDecidedAsAlone() async throws {
        try await withStore { store, database in
            // Given two queued jobs, and four processing ones (each on its first attempt)
            for id in ["a", "b", "done", "stale", "failing", "busy"] { try await create(store, id) }
            for id in ["done", "stale", "failing", "busy"] { _ = try await store.start(id, now: now) }
            let later = now.addingTimeInterval(5)
            // When one batch starts the queued ones and the busy one, and records a completion, a
            // result of an attempt that never was, a retryable failure, and a result of no job
            let outcome = await store.write(starts: ["a", "busy", "b"], results: [
                (JobAttempt(jobId: "done", attempt: 1), .done(JobOutput(resultKey: "results/done.jpg", thumbnailKey: "thumbs/done.jpg"))),
                (JobAttempt(jobId: "stale", attempt: 2), .done(JobOutput(resultKey: "results/stale-2.jpg", thumbnailKey: "thumbs/stale-2.jpg"))),
                (JobAttempt(jobId: "failing", attempt: 1), .failed(error: "the provider timed out", retryable: true)),
                (JobAttempt(jobId: "ghost", attempt: 1), .cancelled),
            ], now: later)

            // Then each start and result answers as it would alone
            #expect(try outcome.starts[0].get()?.status == .processing && (try outcome.starts[0].get()?.attempts) == 1)
            #expect(try outcome.starts[1].get() == nil, "a processing job is not started again")
            #expect(try outcome.starts[2].get()?.startedAt == later)
            guard case .applied(let done) = try outcome.results[0].get().outcome else { Issue.record("\(outcome.results[0])"); return }
            #expect(done.status == .completed && done.resultKey == "results/done.jpg" && done.finishedAt == later)
            guard case .refused = try outcome.results[1].get().outcome else { Issue.record("a stale attempt's result was not refused"); return }
            guard case .applied(let failing) = try outcome.results[2].get().outcome else { Issue.record("\(outcome.results[2])"); return }
            #expect(failing.status == .queued && failing.lastError == "the provider timed out")
            #expect(try outcome.results[2].get().retryAfter != nil)
            #expect(try outcome.results[3].get().outcome == .refused("no such job"))

            // And the rows read back as the batch decided them
            for (id, status) in [("a", JobStatus.processing), ("b", .processing), ("busy", .processing), ("done", .completed), ("stale", .processing), ("failing", .queued)] {
                #expect(try await store.job(id, userId: nil)?.status == status, "\(id)")
            }
            let stored = try #require(try await store.job("done", userId: nil))
            #expect(stored == done)
            // And the completion's charge is committed, the stale result's files deleted, through the outbox
            let outbox = try await PostgresOutboxRows.all(database)
            #expect(outbox.filter { $0.topic == "quota" }.map { "\($0.kind) \($0.jobId) v\($0.version)" } == ["commit done v\(done.version)"])
            let deletions = outbox.filter { $0.topic == "blobs" }
            #expect(deletions.map(\.jobId) == ["stale"])
            #expect(try deletions.first.flatMap(\.payload).map { try JSONDecoder().decode([String].self, from: $0) } == ["results/stale-2.jpg", "thumbs/stale-2.jpg"])
            // And every changed row is due for history
            let due = try await database.connection { db in
                try await db.all("SELECT id FROM jobs_job WHERE history_due_at = \(later.timeIntervalSince1970) ORDER BY id", as: String.self, logger: quietLogger)
            }
            #expect(due == ["a", "b", "done", "failing"])
            // And all of it was one transaction
            let written = try await writers(database, jobs: ["a", "b", "done", "failing", "stale"])
            #expect(written.jobs.count == 2, "the batch's rows and the stale job's start: \(written.jobs)")
            let batch = try await writers(database, jobs: ["a", "b", "done", "failing"])
            #expect(batch.jobs.count == 1 && batch.outbox.isSubset(of: batch.jobs), "\(batch)")
        }
    }

    @Test func aBatchThatStartsAJobAndRecordsItsResultReadsItsOwnStart() async throws {
        try await withStore { store, _ in
            try await create(store, "quick")
            let outcome = await store.write(
                starts: ["quick"], results: [(JobAttempt(jobId: "quick", attempt: 1), .done(JobOutput(resultKey: "r", thumbnailKey: "t")))], now: now
            )
            guard case .applied(let job) = try outcome.results[0].get().outcome else { Issue.record("not applied: \(outcome.results)"); return }
            #expect(job.status == .completed && job.attempts == 1)
            #expect(try await store.job("quick", userId: nil) == job)
        }
    }
}
