import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import Storage

/// The dispatcher's writes, group-committed: the events whose writes (`write(starts:results:now:)`)
/// arrive while a batch is in PostgreSQL make the next batch (`PostgresBatcher`, one per term of
/// the lease), in one transaction of 4 statements whatever its size (5 with push notifications),
/// instead of one transaction for each start and each result, or one for each event: BEGIN; the
/// lease's fence and every row the batch names, locked in the order of their ids (two batches, or
/// a batch and a handler's write of one row, never wait for each other in a circle), in one
/// statement (`lockedRows`); every write in one statement (`writeChanges`: the changed rows as
/// one JSON array, as creations insert them; the quota settlements and file deletions; the
/// attempts started and ended); the devices' notifications of the jobs that ended, with push on;
/// COMMIT. The events are decided in the order they arrived, each one's starts first and then its
/// results, as the SQLite store writes them, each start and result by `JobRules` on the row as
/// the batch has changed it so far.
extension PostgresJobsStore {
    /// One event's writes.
    struct DispatchEvent: Sendable {
        var starts: [String]
        var workers: [String: String]
        var results: [(attempt: JobAttempt, result: JobResult)]
        var now: Date
    }

    /// The group commit of the dispatcher's writes made through `store` (and its fence).
    static func dispatchBatcher(_ store: PostgresJobsStore) -> PostgresBatcher<DispatchEvent, JobsBatchOutcome> {
        PostgresBatcher(database: store.database) { events in
            try await store.write(events).map { .success($0) }
        }
    }

    public func write(starts: [String], workers: [String: String], results: [(attempt: JobAttempt, result: JobResult)], now: Date) async -> JobsBatchOutcome {
        guard !starts.isEmpty || !results.isEmpty else { return JobsBatchOutcome(starts: [], results: []) }
        let event = DispatchEvent(starts: starts, workers: workers, results: results, now: now)
        do {
            if let dispatches { return try await dispatches.submit(event) }
            return try await write([event])[0]
        } catch {
            return JobsBatchOutcome(starts: starts.map { _ in .failure(error) }, results: results.map { _ in .failure(error) })
        }
    }

    /// Writes `events` in one transaction, run again (up to `batchAttempts` in all) after a
    /// deadlock PostgreSQL reports anyway.
    func write(_ events: [DispatchEvent]) async throws -> [JobsBatchOutcome] {
        var attempt = 1
        while true {
            do {
                // The lease's fence is the batch's first read (`lockedRows`), not a statement of its own.
                return try await write(fenced: false) { store, db in try await store.dispatchBatch(db, events) }
            } catch let error as PSQLError where attempt < Self.batchAttempts && ["40P01", "40001"].contains(error.serverInfo?[.sqlState] ?? "") {
                logger.debug("dispatch batch run again", metadata: ["sqlState": "\(error.serverInfo?[.sqlState] ?? "")"])
            }
            attempt += 1
        }
    }

    /// How many times a batch is run again after a deadlock PostgreSQL reports anyway.
    static let batchAttempts = 3

    private func dispatchBatch(_ db: PostgresConnection, _ events: [DispatchEvent]) async throws -> [JobsBatchOutcome] {
        let ids = Array(Set(events.flatMap { $0.starts + $0.results.map(\.attempt.jobId) })).sorted()
        var jobs: [String: JobRecord] = [:]
        for job in try await lockedRows(db, ids) { jobs[job.id] = job }
        var changed: Set<String> = []
        var outbox: [OutboxRow] = []
        var ended: [JobRecord] = []
        var attemptsStarted: [(job: JobRecord, worker: String?)] = []
        var attemptsEnded: [EndedAttempt] = []
        func apply(_ transition: JobRules.Transition, at now: Date) {
            jobs[transition.job.id] = transition.job
            changed.insert(transition.job.id)
            if let settlement = transition.settlement {
                ended.append(transition.job)
                outbox.append(OutboxRow(
                    topic: OutboxEntry.Topic.quota, kind: settlement.rawValue, jobId: transition.job.id, version: transition.job.version, payload: nil, at: now
                ))
            }
        }

        var outcomes: [JobsBatchOutcome] = []
        for event in events {
            let now = event.now
            var started: [Result<JobRecord?, any Error>] = []
            for id in event.starts {
                guard let job = jobs[id], let transition = JobRules.start(job, now: now) else {
                    started.append(.success(nil))
                    continue
                }
                apply(transition, at: now)
                attemptsStarted.append((transition.job, event.workers[id]))
                started.append(.success(transition.job))
            }
            var recorded: [Result<(outcome: JobReportOutcome, retryAfter: Duration?), any Error>] = []
            for (attempt, result) in event.results {
                guard let job = jobs[attempt.jobId] else {
                    recorded.append(.success((.refused("no such job"), nil)))
                    continue
                }
                switch JobRules.report(job, attempt, result, retry: retry, now: now) {
                case .refuse(let reason):
                    // A refused result's files are not the job's: deleted, as `discardOutput` does.
                    if case .done(let output) = result {
                        let keys = [output.resultKey, output.thumbnailKey].filter { $0 != job.resultKey && $0 != job.thumbnailKey }
                        if !keys.isEmpty {
                            outbox.append(OutboxRow(
                                topic: OutboxEntry.Topic.blobs, kind: "delete", jobId: job.id, version: 0, payload: try JSONEncoder().encode(keys), at: now
                            ))
                        }
                    }
                    recorded.append(.success((.refused(reason), nil)))
                case .alreadyRecorded(let job):
                    recorded.append(.success((.alreadyRecorded(job), nil)))
                case .apply(let transition):
                    apply(transition, at: now)
                    if let outcome = AttemptRecord.outcome(of: transition.job.status) { attemptsEnded.append(EndedAttempt(transition.job, outcome: outcome)) }
                    recorded.append(.success((.applied(transition.job), transition.retryAfter)))
                }
            }
            outcomes.append(JobsBatchOutcome(starts: started, results: recorded))
        }

        // An attempt's start and its end never share a batch: a worker hears of a start only
        // once it is written.
        try await writeChanges(
            db, jobs: changed.sorted().compactMap { jobs[$0] }, outbox: outbox, started: attemptsStarted, ended: attemptsEnded
        )
        try await notify(db, ended)
        return outcomes
    }

    /// The rows of `ids` that exist, locked in the order of their ids. With a lease, its fence
    /// comes first in the same call (`jobs_locked_rows`, migration v12): the lease row `FOR
    /// SHARE` (as `write(fenced:)` reads it), then the rows, so that a batch takes one round trip
    /// fewer; a replica whose lease was taken locks none of them and throws `DispatchDeposed`.
    func lockedRows(_ db: PostgresConnection, _ ids: [String]) async throws -> [JobRecord] {
        guard let lease = fence else {
            return try await rows(db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE id = ANY(\(ids)::text[]) ORDER BY id FOR UPDATE")
        }
        do {
            var jobs: [JobRecord] = []
            for try await job in try await db.execute(LockedRows(lease: lease, ids: ids), logger: logger) { jobs.append(job) }
            return jobs
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == LockedRows.leaseNotHeld {
            throw DispatchDeposed(term: lease.term)
        }
    }

    /// `lockedRows`' statement: a call of `jobs_locked_rows` (migration v12), prepared once per
    /// connection. It fails with `leaseNotHeld` unless the lease is held under its term.
    struct LockedRows: PostgresPreparedStatement {
        static let name = "jobs_locked_rows"
        static let sql = "SELECT \(PostgresJobsStore.columns) FROM jobs_locked_rows($1, $2, $3::text[])"
        /// The SQLSTATE of the call's refusal.
        static let leaseNotHeld = "PJ001"
        var lease: Lease
        var ids: [String]

        func makeBindings() throws -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 3)
            bindings.append(lease.holder)
            bindings.append(lease.term)
            bindings.append(ids)
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> JobRecord { try PostgresJobsStore.job(row) }
    }

    /// Writes what a batch changed, in one call of `jobs_write_changes` (migration v11) whatever
    /// its size, that function's one statement: the changed rows, each due
    /// for history at once (every transition bumps the version); the quota settlements and file
    /// deletions, in their order (no payload is written as an empty text: a payload is JSON, never
    /// empty); the attempts started, and those ended (one ended already stays as it was). Each part
    /// is a data-modifying `WITH` query, which PostgreSQL runs once whether or not anything reads
    /// it: one round trip, where a statement for each part made four, each waited for in turn
    /// while the batch held its rows' locks. The parts share one snapshot, so none sees another's
    /// rows: an attempt started and ended in one call (which the dispatcher never sends: a worker
    /// hears of a start only once it is written) is written in two.
    ///
    /// The changed rows' ids are given again as an array, and so are the ended attempts' jobs: the
    /// planner takes any `jsonb_populate_recordset` or `unnest` for 100 rows or so, and joined
    /// them to their tables by reading the whole tables (a hash join over a sequential scan: 1.5
    /// ms a batch of 20 at 5,000 jobs, growing with the table); `id = ANY` is planned as index
    /// probes, the only plan the function allows.
    func writeChanges(
        _ db: PostgresConnection, jobs: [JobRecord] = [], outbox: [OutboxRow] = [], started: [(job: JobRecord, worker: String?)] = [],
        ended: [EndedAttempt] = []
    ) async throws {
        guard !jobs.isEmpty || !outbox.isEmpty || !started.isEmpty || !ended.isEmpty else { return }
        let startedAttempts = Set(started.map { AttemptKey(jobId: $0.job.id, attempt: $0.job.attempts) })
        if !ended.isEmpty, ended.contains(where: { startedAttempts.contains(AttemptKey(jobId: $0.jobId, attempt: $0.attempt)) }) {
            try await writeChanges(db, jobs: jobs, outbox: outbox, started: started)
            try await writeChanges(db, ended: ended)
            return
        }
        var bindings = PostgresBindings(capacity: 17)
        bindings.append(try JobRowsJSON.changed(jobs))
        bindings.append(jobs.map(\.id))
        bindings.append(outbox.map(\.topic))
        bindings.append(outbox.map(\.kind))
        bindings.append(outbox.map(\.jobId))
        bindings.append(outbox.map(\.version))
        bindings.append(outbox.map(\.payload))
        bindings.append(outbox.map(\.at))
        bindings.append(started.map(\.job.id))
        bindings.append(started.map(\.job.attempts))
        bindings.append(started.map { $0.worker ?? "" })
        bindings.append(started.map { $0.job.updatedAt.timeIntervalSince1970 })
        bindings.append(ended.map(\.jobId))
        bindings.append(ended.map(\.attempt))
        bindings.append(ended.map(\.at))
        bindings.append(ended.map(\.outcome))
        bindings.append(ended.map { $0.error ?? "" })
        for try await _ in try await db.execute(WriteChanges(bindings: bindings), logger: logger) {}
    }

    /// `writeChanges`' statement: a call of `jobs_write_changes` (migration v11, which says why it
    /// is a function), prepared by postgres-nio once per connection, by name. Its one row (the
    /// function returns `void`) is read and dropped.
    struct WriteChanges: PostgresPreparedStatement {
        typealias Row = Void
        static let name = "jobs_write_changes"
        static let sql = """
            SELECT jobs_write_changes($1::jsonb, $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::float8[],
                                      $9::text[], $10::bigint[], $11::text[], $12::float8[], $13::text[], $14::bigint[], $15::float8[], $16::text[], $17::text[])
            """
        var bindings: PostgresBindings

        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws {}
    }
}

/// An attempt, as the key of a set.
private struct AttemptKey: Hashable {
    var jobId: String
    var attempt: Int
}

/// An outbox entry of a dispatch batch.
struct OutboxRow {
    var topic, kind, jobId: String
    var version: Int
    /// The payload's JSON text; empty for none.
    var payload: String
    /// When it was made (its event's time), in seconds since 1970.
    var at: Double

    init(topic: String, kind: String, jobId: String, version: Int, payload: Data?, at: Date) {
        self.at = at.timeIntervalSince1970
        self.topic = topic
        self.kind = kind
        self.jobId = jobId
        self.version = version
        self.payload = payload.map { String(decoding: $0, as: UTF8.self) } ?? ""
    }
}
