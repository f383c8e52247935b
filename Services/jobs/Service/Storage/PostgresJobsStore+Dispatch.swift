import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import Storage

/// The dispatcher's writes, group-committed: the events whose writes (`write(starts:results:now:)`)
/// arrive while a batch is in PostgreSQL make the next batch (`PostgresBatcher`, one per term of
/// the lease), in one transaction of 5 statements whatever its size (6 with push notifications),
/// instead of one transaction for each start and each result, or one for each event: BEGIN; the
/// lease's fence; every row the batch names, locked in the order of their ids (two batches, or a
/// batch and a handler's write of one row, never wait for each other in a circle); every write in
/// one statement (`writeChanges`: the changed rows as one JSON array, as creations insert them;
/// the quota settlements and file deletions; the attempts started and ended); the devices'
/// notifications of the jobs that ended, with push on; COMMIT. The events are decided in the
/// order they arrived, each one's starts first and then its results, as the SQLite store writes
/// them, each start and result by `JobRules` on the row as the batch has changed it so far.
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
                return try await write(fenced: true) { store, db in try await store.dispatchBatch(db, events) }
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
        for job in try await rows(db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE id = ANY(\(ids)::text[]) ORDER BY id FOR UPDATE") {
            jobs[job.id] = job
        }
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

    /// Writes what a batch changed, in one statement whatever its size: the changed rows, each due
    /// for history at once (every transition bumps the version); the quota settlements and file
    /// deletions, in their order (no payload is written as an empty text: a payload is JSON, never
    /// empty); the attempts started, and those ended (one ended already stays as it was). Each part
    /// is a data-modifying `WITH` query, which PostgreSQL runs once whether or not anything reads
    /// it: one round trip, where a statement for each part made four, each waited for in turn
    /// while the batch held its rows' locks. The parts share one snapshot, so none sees another's
    /// rows: an attempt started and ended in one call (which the dispatcher never sends: a worker
    /// hears of a start only once it is written) is written in two.
    ///
    /// The changed rows' ids are given again as an array: the planner takes any
    /// `jsonb_populate_recordset` for 100 rows, and joined it to `jobs_job` by reading the whole
    /// table (a hash join over a sequential scan: 1.5 ms a batch of 20 at 5,000 jobs, growing with
    /// the table) until the table was large enough for index probes to look cheaper; `id = ANY`
    /// is planned as index probes.
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
        let ids = jobs.map(\.id)
        let rows = String(decoding: try JSONEncoder().encode(try jobs.map(ChangedJobRow.init)), as: UTF8.self)
        try await db.query("""
            WITH changed AS (
                UPDATE jobs_job j SET status = r.status, progress = r.progress, attempts = r.attempts, last_error = r.last_error,
                    result_key = r.result_key, thumbnail_key = r.thumbnail_key, updated_at = r.updated_at, started_at = r.started_at,
                    finished_at = r.finished_at, version = r.version, cancel_requested = r.cancel_requested, submission = r.submission,
                    history_due_at = r.updated_at, history_attempts = 0
                FROM jsonb_populate_recordset(NULL::jobs_job, \(rows)::jsonb) AS r
                WHERE j.id = r.id AND j.id = ANY(\(ids)::text[])
            ), outbox AS (
                INSERT INTO jobs_outbox (topic, kind, job_id, version, payload, created_at, next_attempt_at)
                SELECT o.topic, o.kind, o.job_id, o.version, CASE WHEN o.payload = '' THEN NULL ELSE convert_to(o.payload, 'UTF8') END, o.at, o.at
                FROM unnest(\(outbox.map(\.topic))::text[], \(outbox.map(\.kind))::text[], \(outbox.map(\.jobId))::text[],
                            \(outbox.map(\.version))::bigint[], \(outbox.map(\.payload))::text[], \(outbox.map(\.at))::float8[])
                    WITH ORDINALITY AS o(topic, kind, job_id, version, payload, at, n)
                ORDER BY o.n
            ), started AS (
                INSERT INTO jobs_attempt (job_id, attempt, worker_id, started_at)
                SELECT j, n, NULLIF(w, ''), t FROM unnest(\(started.map(\.job.id))::text[], \(started.map(\.job.attempts))::bigint[],
                                                       \(started.map { $0.worker ?? "" })::text[], \(started.map { $0.job.updatedAt.timeIntervalSince1970 })::float8[]) AS s(j, n, w, t)
                ORDER BY j, n
                ON CONFLICT (job_id, attempt) DO UPDATE SET worker_id = excluded.worker_id, started_at = excluded.started_at, ended_at = NULL, outcome = NULL, error = NULL
            )
            UPDATE jobs_attempt a SET ended_at = e.at, outcome = e.outcome, error = NULLIF(e.error, '')
            FROM unnest(\(ended.map(\.jobId))::text[], \(ended.map(\.attempt))::bigint[], \(ended.map(\.at))::float8[],
                        \(ended.map(\.outcome))::text[], \(ended.map { $0.error ?? "" })::text[]) AS e(job_id, attempt, at, outcome, error)
            WHERE a.job_id = e.job_id AND a.attempt = e.attempt AND a.ended_at IS NULL
            """, logger: logger)
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

/// What a transition changes in a job's row (what `update` writes), as `jsonb_populate_recordset`
/// reads it: keys named as the columns, an absent key NULL.
private struct ChangedJobRow: Encodable {
    var id, status: String
    var progress: Double
    var attempts: Int
    var last_error, result_key, thumbnail_key: String?
    var updated_at: Double
    var started_at, finished_at: Double?
    var version: Int
    var cancel_requested: Bool
    var submission: String?

    init(_ job: JobRecord) throws {
        id = job.id
        status = job.status.rawValue
        progress = job.progress
        attempts = job.attempts
        last_error = job.lastError
        result_key = job.resultKey
        thumbnail_key = job.thumbnailKey
        updated_at = job.updatedAt.timeIntervalSince1970
        started_at = job.startedAt?.timeIntervalSince1970
        finished_at = job.finishedAt?.timeIntervalSince1970
        version = job.version
        cancel_requested = job.cancelRequested
        submission = try JobRows.text(job.submission)
    }
}
