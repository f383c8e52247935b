import Foundation
import GRDB
import JobsCore
import Messages
import Storage

/// The job lifecycle in rows, on SQLite: the jobs service's `JobsStore`. Every state change bumps
/// the job's version and marks the row due for history (`JobsHistoryFeed` reads the event from the
/// row), and writes the quota settlement of a job that ended to the outbox, in the same
/// transaction. Every write goes through the group committer.
public struct SQLiteJobsStore: ReportingJobsStore {
    public let database: JobsDatabase
    public let retry: RetryPolicy
    /// Effect ids to the titles the app shows, carried in history events.
    public let effectTitles: [String: String]
    /// The platforms push notifications are sent on (none: push is off, and nothing is written).
    public let pushPlatforms: [PushPlatform]

    public init(database: JobsDatabase, retry: RetryPolicy = RetryPolicy(), effectTitles: [String: String] = [:], pushPlatforms: [PushPlatform] = []) {
        self.database = database
        self.retry = retry
        self.effectTitles = effectTitles
        self.pushPlatforms = pushPlatforms
    }

    public typealias Outcome = JobReportOutcome
    public typealias State = JobState
    public typealias Purge = PurgedJob

    /// Creates a queued job; the same id for the same user returns the existing job. Answers once
    /// the job is durable, in a transaction shared with the creations that arrived meanwhile.
    /// The group committer's counts: transactions and the changes they carried.
    public var writeStatistics: GroupCommitter.Statistics { database.writeStatistics }

    public func create(_ request: CreateJob, effectId: String, parameters: [String: Double], now: Date) async throws -> (job: JobRecord, created: Bool) {
        try await database.write { [retry] db in
            // A new id (the usual case) is told by one column, without reading a whole row.
            if let owner = try String.fetchOne(db.cachedStatement(sql: "SELECT userId FROM job WHERE id = ?"), arguments: [request.jobId]) {
                guard owner == request.userId, let existing = try JobRows.job(db, request.jobId) else {
                    throw BusError(.conflict, "job id \(request.jobId) belongs to another user")
                }
                return (existing, false)
            }
            if try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM abandoned WHERE jobId = ?"), arguments: [request.jobId]) == true {
                throw BusError(Jobs.ErrorCode.abandoned, "job \(request.jobId) was abandoned: its reservation was given back before it was created; send a new request", retryable: false)
            }
            let job = JobRecord(
                id: request.jobId, userId: request.userId, isPro: request.isPro, imageKey: request.imageKey,
                effectId: effectId, parameters: parameters, prompt: request.prompt, status: .queued, progress: 0,
                attempts: 0, maxAttempts: retry.maxAttempts, lastError: nil, resultKey: nil, thumbnailKey: nil,
                createdAt: now, updatedAt: now, startedAt: nil, finishedAt: nil, version: 1, credits: request.credits,
                traceParent: request.traceParent, imageETag: request.imageETag
            )
            try JobRows.insert(db, job)
            return (job, true)
        }
    }

    /// Whether the job exists, and its status; with `abandonIfAbsent`, an id with no job is
    /// recorded as abandoned in the same transaction, so a creation arriving later fails. A job
    /// purged before quota heard how it ended still answers that end (from its settlement, waiting
    /// in the outbox), so that quota settles it the same way.
    public func lookup(_ id: String, abandonIfAbsent: Bool, now: Date) async throws -> JobStatus? {
        guard abandonIfAbsent else { return try await job(id)?.status }
        return try await database.write { db in
            if let job = try JobRows.job(db, id) { return job.status }
            // Purged, its settlement not yet delivered: the job ended as that settlement says.
            if let settlement = try String.fetchOne(db, sql: "SELECT kind FROM outbox WHERE topic = 'quota' AND jobId = ? ORDER BY id DESC LIMIT 1", arguments: [id]) {
                return JobRules.Settlement(rawValue: settlement) == .commit ? .completed : .failed
            }
            try db.execute(sql: "INSERT OR IGNORE INTO abandoned (jobId, at) VALUES (?, ?)", arguments: [id, now])
            return nil
        }
    }

    /// The job, if `userId` owns it (nil for anyone else: their ids answer 404).
    public func job(_ id: String, userId: String? = nil) async throws -> JobRecord? {
        try await database.read { db in
            guard let job = try JobRows.job(db, id) else { return nil }
            if let userId, job.userId != userId { return nil }
            return job
        }
    }

    /// The jobs of these ids that exist, in one read (read by position, as every state change
    /// reads them: GRDB's `Codable` records cost most of a watch's time).
    public func jobs(_ ids: [String]) async throws -> [JobRecord] {
        guard !ids.isEmpty else { return [] }
        return try await database.read { db in try JobRows.jobs(db, ids) }
    }

    /// The states of the jobs of these ids that exist, in one read of four columns.
    public func states(_ ids: [String]) async throws -> [String: State] {
        guard !ids.isEmpty else { return [:] }
        return try await database.read { db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(sql: "SELECT id, userId, version, status, progress FROM job WHERE id IN (SELECT value FROM json_each(?))"),
                arguments: [JobRows.jsonArray(ids)]
            )
            var states: [String: State] = [:]
            while let row = try rows.next() {
                states[row["id"]] = State(userId: row["userId"], version: row["version"],
                                          status: JobStatus(rawValue: row["status"]) ?? .queued, progress: row["progress"])
            }
            return states
        }
    }

    /// How many jobs are in each state, how many outbox entries wait for each topic (history's:
    /// the rows due for it), and when the oldest queued job was created (the first row of the
    /// status index).
    public func counts() async throws -> JobCounts {
        try await database.read { db in
            var counts = JobCounts()
            for row in try Row.fetchAll(db, sql: "SELECT status, COUNT(*) AS n FROM job GROUP BY status") {
                if let status = JobStatus(rawValue: row["status"]) { counts.states[status] = row["n"] }
            }
            for row in try Row.fetchAll(db, sql: "SELECT topic, COUNT(*) AS n FROM outbox GROUP BY topic") {
                counts.outbox[row["topic"]] = row["n"]
            }
            counts.outbox[OutboxEntry.Topic.history] = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM job WHERE historyDueAt IS NOT NULL")
            counts.oldestQueued = try Date.fetchOne(db, sql: "SELECT createdAt FROM job WHERE status = 'queued' ORDER BY createdAt LIMIT 1")
            return counts
        }
    }

    /// The current attempt submitted its generation to a provider's queue: the request is kept
    /// on the job (not a state change: the job stays processing, its version unchanged).
    public func recordSubmission(_ attempt: JobAttempt, _ request: ProviderRequest) async throws -> Outcome {
        try await database.write { db in
            guard let job = try JobRows.job(db, attempt.jobId) else { return .refused("no such job") }
            switch JobRules.submitted(job, attempt, request) {
            case .refuse(let reason): return .refused(reason)
            case .alreadyRecorded(let job): return .alreadyRecorded(job)
            case .apply(let transition):
                try JobRows.update(db, transition.job, announce: false)
                return .applied(transition.job)
            }
        }
    }

    /// The current attempt of every processing job, for the dispatcher's reconcile.
    public func processingAttempts() async throws -> [JobAttempt] {
        try await database.read { db in
            try Row.fetchAll(db, sql: "SELECT id, attempts FROM job WHERE status = ?", arguments: [JobStatus.processing.rawValue])
                .map { JobAttempt(jobId: $0["id"], attempt: $0["attempts"]) }
        }
    }

    /// Cancels: a queued job at once (charge released); a processing job is marked and the
    /// dispatcher tells its worker. Finished jobs answer `jobs.already_finished`.
    public func cancel(_ id: String, userId: String, now: Date) async throws -> JobRecord {
        try await database.write { [self] db in
            guard let job = try JobRows.job(db, id), job.userId == userId else {
                throw BusError(.notFound, "no job \(id)")
            }
            switch JobRules.cancel(job, now: now) {
            case .alreadyFinished(let status):
                throw BusError(Jobs.ErrorCode.alreadyFinished, "job \(id) has already \(status.rawValue)")
            case .unchanged(let job):
                return job
            case .mark(let marked):
                // Not a state change: history hears of it when the worker's `cancelled` ends the job.
                try JobRows.update(db, marked, announce: false)
                return marked
            case .apply(let transition):
                try apply(db, transition)
                return transition.job
            }
        }
    }


    /// Removes a job for good. A job that has not ended is cancelled first with its charge
    /// released; then its row (and with it what history had still to hear), and (through the blob
    /// janitor) its result, thumbnail and, when no other job of the user uses it, its original
    /// upload.
    public func purge(_ id: String, userId: String, now: Date) async throws -> Purge {
        try await database.write { db in
            guard let job = try JobRecord.fetchOne(db, key: id), job.userId == userId else { return Purge(job: nil) }
            // A job that has not ended gives its charge back, as a cancel would.
            if let settlement = JobRules.purgeSettlement(job) { try Self.settle(db, job: job, settlement, now: now) }
            _ = try JobRecord.deleteOne(db, key: id)
            try db.execute(sql: "DELETE FROM attempt WHERE jobId = ?", arguments: [id])
            var keys = [job.resultKey, job.thumbnailKey].compactMap { $0 }
            let sharing = try JobRecord
                .filter(JobRecord.Columns.userId == userId && JobRecord.Columns.imageKey == job.imageKey)
                .fetchCount(db)
            if sharing == 0 { keys.append(job.imageKey) }
            try Self.discardBlobs(db, keys, jobId: id, now: now)
            return Purge(job: job)
        }
    }

    /// Those of `keys` that no job uses as its original.
    public func unused(_ keys: [String]) async throws -> [String] {
        guard !keys.isEmpty else { return [] }
        let used = try await database.read { db in
            try Set(String.fetchAll(db, JobRecord.select(JobRecord.Columns.imageKey).filter(keys.contains(JobRecord.Columns.imageKey))))
        }
        return keys.filter { !used.contains($0) }
    }

    /// A refused result's files, unless they are the job's own (a repeated report of the accepted
    /// attempt): nothing will ever point at them.
    public func discardOutput(_ output: JobOutput, of attempt: JobAttempt, now: Date) async throws {
        try await database.write { db in try Self.discardOutput(db, output, of: attempt, now: now) }
    }

    static func discardOutput(_ db: Database, _ output: JobOutput, of attempt: JobAttempt, now: Date) throws {
        let job = try JobRows.job(db, attempt.jobId)
        let keys: [String] = [output.resultKey, output.thumbnailKey].filter { $0 != job?.resultKey && $0 != job?.thumbnailKey }
        try discardBlobs(db, keys, jobId: attempt.jobId, now: now)
    }

    /// On start-up: jobs left processing with a cancel asked for are cancelled. Other processing
    /// jobs stay as they are: their workers name them in their next heartbeats and are given
    /// them back, and the dispatcher's reconcile queues again any that no worker claims.
    /// Returns every queued job, oldest first, for the dispatcher.
    public func recover(now: Date) async throws -> [JobRecord] {
        try await database.write { [self] db in
            let orphans = try JobRecord.filter(JobRecord.Columns.status == JobStatus.processing.rawValue && Column("cancelRequested") == true).fetchAll(db)
            for job in orphans {
                if let transition = JobRules.recover(job, now: now) { try apply(db, transition) }
            }
            return try JobRecord
                .filter(JobRecord.Columns.status == JobStatus.queued.rawValue)
                .order(JobRecord.Columns.createdAt)
                .fetchAll(db)
        }
    }

    // MARK: Batches

    /// The dispatcher's writes of one event as one piece of the group committer's work: one
    /// transaction in which a write that fails leaves the others. The writes first run one after
    /// the other in one savepoint; if one throws, that savepoint is rolled back and they run again
    /// each in a savepoint of its own, so that only the failing one is undone. The usual batch,
    /// where none fails, pays for one savepoint, not one per write. The whole transaction failing
    /// fails them all.
    public func write(starts: [String], workers: [String: String], results: [(attempt: JobAttempt, result: JobResult)], now: Date) async -> JobsBatchOutcome {
        guard !starts.isEmpty || !results.isEmpty else { return JobsBatchOutcome(starts: [], results: []) }
        do {
            return try await database.write { [self] db in
                let together = Self.alone(db) {
                    let batch = try BatchJobs(db, ids: starts + results.map(\.attempt.jobId))
                    return JobsBatchOutcome(
                        starts: try starts.map { id in .success(try startRow(db, id, worker: workers[id], now: now, batch: batch)) },
                        results: try results.map { report in .success(try recordRow(db, report.attempt, report.result, now: now, batch: batch)) }
                    )
                }
                if case .success(let outcome) = together { return outcome }
                return JobsBatchOutcome(
                    starts: starts.map { id in Self.alone(db) { try startRow(db, id, worker: workers[id], now: now) } },
                    results: results.map { report in Self.alone(db) { try recordRow(db, report.attempt, report.result, now: now) } }
                )
            }
        } catch {
            return JobsBatchOutcome(starts: starts.map { _ in .failure(error) }, results: results.map { _ in .failure(error) })
        }
    }

    /// A queued job started: processing as a new attempt; nil if it is no longer queued.
    func startRow(_ db: Database, _ id: String, worker: String?, now: Date, batch: BatchJobs? = nil) throws -> JobRecord? {
        guard let job = try batch?.job(db, id) ?? JobRows.job(db, id), let transition = JobRules.start(job, now: now) else { return nil }
        try apply(db, transition)
        try JobRows.startAttempt(db, transition.job, worker: worker)
        batch?.changed(transition.job)
        return transition.job
    }

    /// A worker's result, as `report` writes it; a refused result's files are left to the blob
    /// janitor, as `discardOutput` leaves them.
    func recordRow(_ db: Database, _ attempt: JobAttempt, _ result: JobResult, now: Date, batch: BatchJobs? = nil) throws
        -> (outcome: JobReportOutcome, retryAfter: Duration?) {
        let written = try reportRow(db, attempt, batch: batch) { [retry] job in JobRules.report(job, attempt, result, retry: retry, now: now) }
        if case .refused = written.outcome, case .done(let output) = result { try Self.discardOutput(db, output, of: attempt, now: now) }
        return written
    }

    /// The jobs of one batch, read in one statement as it starts and kept as its changes write
    /// them: a batch of starts and results pays for one read, not one a job. (GRDB builds an index
    /// of a statement's column names each time it steps one into rows: for a job's 23 columns,
    /// about as much as the rest of its read; perf of `bench-jobs` showed the reads at 5% of the
    /// machine.) Only for the batch's first try: if that is rolled back, each write reads again.
    final class BatchJobs {
        private var jobs: [String: JobRecord]
        private let ids: Set<String>

        /// A row that does not read as a job is left out, to be read (and fail) on its own.
        init(_ db: Database, ids: [String]) throws {
            var ids = Set(ids), jobs: [String: JobRecord] = [:]
            try JobRows.forEachRow(db, Array(ids)) { row in
                do {
                    let job = try JobRows.job(row)
                    jobs[job.id] = job
                } catch {
                    ids.remove(row[0])
                }
            }
            self.ids = ids
            self.jobs = jobs
        }

        /// The job as the batch last wrote it; nil if there is none. An id the batch did not
        /// read is read now.
        func job(_ db: Database, _ id: String) throws -> JobRecord? {
            ids.contains(id) ? jobs[id] : try JobRows.job(db, id)
        }

        /// A write of the batch changed the job's row to `job`.
        func changed(_ job: JobRecord) {
            if ids.contains(job.id) { jobs[job.id] = job }
        }
    }

    /// `body` in a savepoint: what it changed is rolled back alone if it throws.
    static func alone<Value>(_ db: Database, _ body: () throws -> Value) -> Result<Value, any Error> {
        var value: Value?
        do {
            try db.inSavepoint {
                value = try body()
                return .commit
            }
            return value.map { .success($0) } ?? .failure(CancellationError())
        } catch {
            return .failure(error)
        }
    }

    // MARK: Rows

    /// Reads the job an attempt belongs to, asks the rules, and writes what they decide, in one
    /// group-committed transaction.
    public func report(_ attempt: JobAttempt, _ decide: @escaping @Sendable (JobRecord) -> JobRules.Decision) async throws -> (outcome: Outcome, retryAfter: Duration?) {
        try await database.write { [self] db in try reportRow(db, attempt, decide) }
    }

    func reportRow(_ db: Database, _ attempt: JobAttempt, batch: BatchJobs? = nil, _ decide: (JobRecord) -> JobRules.Decision) throws
        -> (outcome: Outcome, retryAfter: Duration?) {
        guard let job = try batch?.job(db, attempt.jobId) ?? JobRows.job(db, attempt.jobId) else { return (.refused("no such job"), nil) }
        switch decide(job) {
        case .refuse(let reason): return (.refused(reason), nil)
        case .alreadyRecorded(let recorded): return (.alreadyRecorded(recorded), nil)
        case .apply(let transition):
            try apply(db, transition)
            batch?.changed(transition.job)
            return (.applied(transition.job), transition.retryAfter)
        }
    }

    /// Writes a transition: the row, due for history, its quota settlement and push notifications,
    /// stamped with the transition's time.
    func apply(_ db: Database, _ transition: JobRules.Transition) throws {
        try JobRows.update(db, transition.job, announce: true)
        if let settlement = transition.settlement {
            try Self.settle(db, job: transition.job, settlement, now: transition.job.updatedAt)
            try notify(db, transition.job)
        }
    }

    /// Files to remove, left to the blob janitor in the same transaction as the change that
    /// orphaned them, so a crash in between loses no deletion.
    static func discardBlobs(_ db: Database, _ keys: [String], jobId: String, now: Date) throws {
        guard !keys.isEmpty else { return }
        try JobRows.insertOutbox(db, topic: OutboxEntry.Topic.blobs, kind: "delete", jobId: jobId, version: 0, payload: try JSONEncoder().encode(keys), now: now)
    }

    /// The quota settlement of an ended job.
    static func settle(_ db: Database, job: JobRecord, _ settlement: JobRules.Settlement, now: Date) throws {
        try JobRows.insertOutbox(db, topic: OutboxEntry.Topic.quota, kind: settlement.rawValue, jobId: job.id, version: job.version, payload: nil, now: now)
    }
}
