import Foundation
import JobsCore
@testable import JobsService
import Messages
import PostgresNIO
import Storage
import Testing
import TestSupport

/// The dispatcher's writes on PostgreSQL: one event's starts and workers' results in one
/// transaction, each decided as it would be alone; and the events that arrive while a batch is in
/// PostgreSQL in the next one.
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

    @Test func eventsThatArriveWhileABatchIsInPostgreSQLAreWrittenTogetherInTheNext() async throws {
        try await withStore { store, database in
            // Given 21 queued jobs, and the first one's row held by another transaction
            let ids = (0...20).map { String(format: "job-%02d", $0) }
            for id in ids { try await create(store, id) }
            let (held, hold) = AsyncStream<Void>.makeStream()
            let (released, release) = AsyncStream<Void>.makeStream()
            async let holder: Void = database.connection(limit: .seconds(120)) { db in
                try await db.query("BEGIN", logger: quietLogger)
                try await db.query("SELECT 1 FROM jobs_job WHERE id = 'job-00' FOR UPDATE", logger: quietLogger)
                hold.yield()
                for await _ in released { break }
                try await db.query("COMMIT", logger: quietLogger)
            }
            for await _ in held { break }
            let dispatches = try #require(store.dispatches)

            // When one event's write starts the first job (its batch waits in PostgreSQL for the
            // row), and 20 more events, each starting one job, arrive meanwhile
            async let first = store.write(starts: ["job-00"], results: [], now: now)
            try await waitUntil {
                try await database.connection { db in
                    try await db.first("SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted", as: Int.self, logger: quietLogger)
                } ?? 0 > 0
            }
            let later = await withTaskGroup(of: JobsBatchOutcome.self) { group in
                for id in ids.dropFirst() {
                    group.addTask { await store.write(starts: [id], results: [], now: now.addingTimeInterval(1)) }
                }
                try? await waitUntil { dispatches.waiting == 20 }
                release.yield()
                return await group.reduce(into: []) { $0.append($1) }
            }
            try await holder
            let firstOutcome = await first

            // Then every job is started, each event answered with its own
            #expect(try firstOutcome.starts.map { try $0.get()?.status } == [.processing])
            #expect(later.count == 20)
            #expect(try later.flatMap { try $0.starts.map { try $0.get()?.status } } == Array(repeating: .processing, count: 20))
            // And the 20 that waited were one batch, one transaction
            #expect(dispatches.statistics.batches == 2 && dispatches.statistics.operations == 21, "\(dispatches.statistics)")
            let waited = try await writers(database, jobs: Array(ids.dropFirst()))
            let firstWriter = try await writers(database, jobs: ["job-00"])
            #expect(waited.jobs.count == 1 && waited.jobs.isDisjoint(with: firstWriter.jobs), "\(waited) \(firstWriter)")
        }
    }

    @Test func anAttemptStartedAndEndedInOneWriteEndsThoughTheWritesShareOneStatement() async throws {
        try await withStore { store, database in
            // Given a queued job
            try await create(store, "x")
            var job = try #require(try await store.job("x", userId: nil))
            job.attempts = 1
            job.status = .completed
            // When one write keeps its first attempt's start and its end (the parts of the batch's
            // one statement share a snapshot: the end's update cannot see the start's row)
            try await database.connection { [job] db in
                try await store.writeChanges(db, started: [(job, "worker-1")], ended: [.init(job, outcome: "completed")])
            }
            // Then the attempt is kept, and as ended
            let attempts = try await store.attempts(of: "x")
            #expect(attempts.map(\.attempt) == [1] && attempts.first?.workerId == "worker-1")
            #expect(attempts.first?.outcome == "completed" && attempts.first?.endedAt != nil, "\(attempts)")
        }
    }

    /// A connection plans `jobs_write_changes` once, from the statistics of that time. Planned
    /// when the tables held a row, the plan scanned both tables whole and kept doing so once they
    /// held thousands (the bench's 8.5 ms batches); the function plans without sequential scans,
    /// so its writes still probe the primary keys (`TestPostgres.sequentialScans` counts).
    @Test func theWritesProbeByKeyAfterTheTablesGrowPastThePlanMadeWhenTheyWereSmall() async throws {
        try await withStore { store, database in
            try await database.connection { db in
                // Given a connection that planned the writes while each table held one row
                try await create(store, "first")
                let first = try await store.rows(db, "SELECT \(unescaped: PostgresJobsStore.columns) FROM jobs_job")
                try await store.writeChanges(db, started: first.map { ($0, "worker-1") })
                try await KeptPlanSteps.keepStatistics(db, of: ["jobs_job", "jobs_attempt"])
                try await store.writeChanges(db, ended: first.map { PostgresJobsStore.EndedAttempt($0, outcome: "completed") })
                // And tables that then grew to 3,000 rows, processing
                try await KeptPlanSteps.addJobs(db, status: "processing", attempts: 1)
                try await db.query("INSERT INTO jobs_attempt (job_id, attempt, worker_id, started_at) SELECT id, 1, 'worker-1', created_at FROM jobs_job WHERE id LIKE 'job-%'", logger: quietLogger)

                // When it writes ten of them completed
                let ten = try await store.rows(db, "SELECT \(unescaped: PostgresJobsStore.columns) FROM jobs_job WHERE id BETWEEN 'job-00001' AND 'job-00010'")
                let done = ten.map { job in
                    var job = job
                    job.status = .completed
                    job.version += 1
                    return job
                }
                let scans = try await TestPostgres.sequentialScans(db, of: ["jobs_job", "jobs_attempt"], logger: quietLogger) {
                    try await store.writeChanges(db, jobs: done, ended: done.map { PostgresJobsStore.EndedAttempt($0, outcome: "completed") })
                }

                // Then they are written, without a scan of either table
                #expect(ten.count == 10)
                #expect(scans == 0, "\(scans) sequential scans of jobs_job and jobs_attempt")
                let ended = try await db.first(
                    "SELECT count(*) FROM jobs_attempt WHERE job_id LIKE 'job-%' AND outcome = 'completed'", as: Int.self, logger: quietLogger
                )
                #expect(ended == 10)
            }
        }
    }

    /// A batch's fence and rows are one call of `jobs_locked_rows`, planned once per connection
    /// like the writes: planned while the jobs table held a row, the kept plan would read it whole
    /// at every batch once it held thousands, but the function plans without sequential scans.
    /// The call answers the rows that exist, in id order, and is refused to a replica that does
    /// not hold the lease.
    @Test func theFenceAndRowsOfABatchProbeByKeyAfterTheTableGrowsPastThePlanMadeWhenItWasSmall() async throws {
        try await withStore { store, database in
            let term = try #require(try await DispatchElection(database: database, holder: "replica-a", ttl: .seconds(60), logger: quietLogger).claim())
            let leader = store.fenced(.init(holder: "replica-a", term: term))
            try await database.connection { db in
                // Given a connection that read a batch's rows while the table held one row
                try await create(store, "first")
                #expect(try await leader.lockedRows(db, ["first"]).map(\.id) == ["first"])
                try await KeptPlanSteps.keepStatistics(db, of: ["jobs_job"])
                #expect(try await leader.lockedRows(db, ["missing"]).isEmpty)
                // And a table that then grew to 3,000 rows
                try await KeptPlanSteps.addJobs(db, status: "queued", attempts: 0)

                // When it reads ten of them and one that does not exist
                var read: [JobRecord] = []
                let wanted = ["job-00007", "job-00003", "nothing", "job-00010"] + (1...7).map { "job-0002\($0)" }
                let scans = try await TestPostgres.sequentialScans(db, of: ["jobs_job", "jobs_leader"], logger: quietLogger) {
                    read = try await leader.lockedRows(db, wanted)
                }

                // Then it finds them in id order, without a scan of either table
                #expect(read.map(\.id) == wanted.filter { $0 != "nothing" }.sorted())
                #expect(scans == 0, "\(scans) sequential scans of jobs_job and jobs_leader")
            }
            // And a replica that does not hold the lease reads nothing
            _ = try await database.connection { db in
                await #expect(throws: DispatchDeposed.self) {
                    _ = try await store.fenced(.init(holder: "replica-b", term: term)).lockedRows(db, ["first"])
                }
            }
        }
    }
}
