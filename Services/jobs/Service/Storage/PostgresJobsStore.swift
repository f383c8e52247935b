import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import ServiceKit
import Storage

/// The job lifecycle on PostgreSQL (`JOBS_DATABASE_URL`), for any number of jobs replicas over one
/// database. The same operations as `SQLiteJobsStore`, decided by the same `JobRules`, each state
/// change marking its row due for history (`PostgresJobsHistoryFeed`) and writing its settlement
/// and file deletions to the outbox, in its transaction.
/// What differs:
/// - **Every replica creates, reads, cancels and purges.** A job's writes lock its row (`FOR
///   UPDATE`); a creation and an abandoning lookup of one id take an advisory lock on the id, so a
///   job is never both created and abandoned. Creations are group-committed: those that arrive
///   while a batch is in PostgreSQL are made in the next, in one transaction
///   (`PostgresJobsStore+Creations.swift`).
/// - **One replica dispatches**: the one holding the `dispatcher` lease in `jobs_leader`
///   (`DispatchLeadership`). Its store is `fenced(_:)` with the lease's term: each of the
///   dispatcher's writes (starts, results, requeues, submissions, recovery) first reads the lease
///   row `FOR SHARE` and refuses (`DispatchDeposed`) unless its term still holds it. A takeover
///   updates that row, so it waits for the fenced writes in flight and every later one of the
///   deposed leader changes nothing.
/// - **The outbox is shared**: each replica's relays claim due entries (`FOR UPDATE SKIP LOCKED`,
///   leased for `PostgresJobsOutbox.lease`), so an entry goes to one relay at a time and one whose
///   relay died is taken up again after the lease.
public struct PostgresJobsStore: ReportingJobsStore {
    let database: PostgresPool
    public let retry: RetryPolicy
    /// Effect ids to the titles the app shows, carried in history events.
    public let effectTitles: [String: String]
    /// The platforms push notifications are sent on (none: push is off, and nothing is written).
    public let pushPlatforms: [PushPlatform]
    let logger: Logger
    /// The lease the dispatcher's writes must still hold; nil for the handler's writes.
    private(set) var fence: Lease?
    /// Creations, group-committed (`PostgresJobsStore+Creations.swift`).
    let creations: PostgresBatcher<Creation, Created>
    /// The dispatcher's writes, group-committed under this store's fence
    /// (`PostgresJobsStore+Dispatch.swift`): one batcher per term, so that a batch never mixes
    /// two terms' writes.
    private(set) var dispatches: PostgresBatcher<DispatchEvent, JobsBatchOutcome>?

    public init(database: PostgresPool, retry: RetryPolicy = RetryPolicy(), effectTitles: [String: String] = [:], pushPlatforms: [PushPlatform] = [],
                logger: Logger) {
        self.database = database
        self.retry = retry
        self.effectTitles = effectTitles
        self.pushPlatforms = pushPlatforms
        self.logger = logger
        self.fence = nil
        self.creations = PostgresBatcher(database: database) { batch in
            try await Self.create(batch, database: database, retry: retry, logger: logger)
        }
        self.dispatches = Self.dispatchBatcher(self)
    }

    /// A term of the dispatcher's lease: who holds it, and which election gave it to them.
    public struct Lease: Sendable, Equatable {
        public var holder: String
        public var term: Int64

        public init(holder: String, term: Int64) {
            self.holder = holder
            self.term = term
        }
    }

    /// This store, its dispatcher's writes fenced by `lease`.
    public func fenced(_ lease: Lease) -> PostgresJobsStore {
        var store = self
        store.fence = lease
        store.dispatches = Self.dispatchBatcher(store)
        return store
    }

    public static let migrations = [
        PostgresMigration("v1: jobs, outbox, abandoned ids, the dispatcher's lease", [
            """
            CREATE TABLE jobs_job (
                id text COLLATE "C" PRIMARY KEY, user_id text COLLATE "C" NOT NULL, is_pro boolean NOT NULL, image_key text NOT NULL,
                effect_id text NOT NULL, parameters text NOT NULL, prompt text, status text NOT NULL, progress double precision NOT NULL,
                attempts bigint NOT NULL, max_attempts bigint NOT NULL, last_error text, result_key text, thumbnail_key text,
                created_at double precision NOT NULL, updated_at double precision NOT NULL, started_at double precision,
                finished_at double precision, version bigint NOT NULL, cancel_requested boolean NOT NULL DEFAULT false,
                credits bigint NOT NULL DEFAULT 1, submission text)
            """,
            "CREATE INDEX jobs_job_by_status ON jobs_job (status, created_at)",
            "CREATE INDEX jobs_job_by_user_image ON jobs_job (user_id, image_key)",
            "CREATE INDEX jobs_job_by_image ON jobs_job (image_key)",
            """
            CREATE TABLE jobs_outbox (
                id bigserial PRIMARY KEY, topic text NOT NULL, kind text NOT NULL, job_id text NOT NULL, version bigint NOT NULL,
                payload bytea, created_at double precision NOT NULL, attempts bigint NOT NULL DEFAULT 0, next_attempt_at double precision NOT NULL)
            """,
            "CREATE INDEX jobs_outbox_due ON jobs_outbox (topic, next_attempt_at)",
            "CREATE INDEX jobs_outbox_by_job ON jobs_outbox (job_id)",
            "CREATE TABLE jobs_abandoned (job_id text PRIMARY KEY, at double precision NOT NULL)",
            "CREATE TABLE jobs_leader (name text PRIMARY KEY, holder text NOT NULL, term bigint NOT NULL, expires_at timestamptz NOT NULL)",
        ]),
        PostgresMigration("v2: the trace a job was created in", [
            "ALTER TABLE jobs_job ADD COLUMN trace_parent text",
        ]),
        // History hears a job's current version from its row (`PostgresJobsHistoryFeed`): a change
        // marks the row due instead of writing an event of its own to the outbox.
        PostgresMigration("v3: history's events read from the job rows", [
            "ALTER TABLE jobs_job ADD COLUMN history_due_at double precision, ADD COLUMN history_attempts bigint NOT NULL DEFAULT 0",
            "CREATE INDEX jobs_job_history_due ON jobs_job (history_due_at) WHERE history_due_at IS NOT NULL",
            "UPDATE jobs_job SET history_due_at = updated_at WHERE id IN (SELECT job_id FROM jobs_outbox WHERE topic = 'history')",
            "DELETE FROM jobs_outbox WHERE topic = 'history'",
        ]),
        // An object store's ETag of the input the gateway checked (`CreateJob.imageETag`).
        PostgresMigration("v4: the version of the image a job was created from", [
            "ALTER TABLE jobs_job ADD COLUMN image_etag text",
        ]),
        // A user's devices (`PUT /api/v1/devices/{token}`): a job that ends writes one push
        // notification per device to the outbox, in the same transaction.
        PostgresMigration("v5: devices for push notifications", [
            """
            CREATE TABLE jobs_device (
                token text COLLATE "C" PRIMARY KEY, user_id text COLLATE "C" NOT NULL, platform text NOT NULL, environment text NOT NULL,
                registered_at double precision NOT NULL)
            """,
            "CREATE INDEX jobs_device_by_user ON jobs_device (user_id, registered_at)",
        ]),
        // Every operator action (`/admin/v1`): who, what, on what, how many, when.
        PostgresMigration("v6: the operators' audit log", [
            """
            CREATE TABLE jobs_audit (
                id bigserial PRIMARY KEY, at double precision NOT NULL, actor text NOT NULL, action text NOT NULL, target text NOT NULL,
                filter text, count bigint NOT NULL, detail text)
            """,
        ]),
        // One row: `DispatchControls` as JSON (paused effects and providers, live limits, drained
        // workers).
        PostgresMigration("v7: operators' dispatch controls", [
            "CREATE TABLE jobs_dispatch_controls (id integer PRIMARY KEY CHECK (id = 1), body text NOT NULL)",
        ]),
        // One row an attempt: the worker it went to, when it started and ended, how it ended.
        PostgresMigration("v8: each job's attempts", [
            """
            CREATE TABLE jobs_attempt (
                job_id text NOT NULL, attempt bigint NOT NULL, worker_id text, started_at double precision NOT NULL,
                ended_at double precision, outcome text, error text, PRIMARY KEY (job_id, attempt))
            """,
        ]),
        // The operators' job list, newest first, reads this backwards instead of sorting the
        // table (the console opens on it). A job's creation never changes: written once.
        PostgresMigration("v9: jobs by creation", [
            "CREATE INDEX jobs_job_created ON jobs_job (created_at, id)",
        ]),
        // (image_key, user_id) answers both questions asked of an image (does this user's other
        // job use it; does any job use it), where two indexes did: a creation writes one fewer.
        PostgresMigration("v10: one index for jobs by image", [
            "DROP INDEX jobs_job_by_user_image",
            "DROP INDEX jobs_job_by_image",
            "CREATE INDEX jobs_job_by_image ON jobs_job (image_key, user_id)",
        ]),
        // `writeChanges`' statement, planned once per connection instead of at every batch
        // (planning it with a batch's arrays as constants took as long as running it). A kept plan
        // is made from the tables' statistics of its time, which in a new or growing database say
        // "small": such a plan read the changed rows by a scan of the whole jobs table, 8.5 ms a
        // batch once it held 20,000 jobs (bench-jobs, auto_explain). Without sequential scans,
        // each part reaches its rows by their primary key, whatever the sizes.
        PostgresMigration("v11: the dispatcher's writes in a function, planned once, by primary keys", [
            """
            CREATE FUNCTION jobs_write_changes(
                changed jsonb, changed_ids text[],
                outbox_topics text[], outbox_kinds text[], outbox_jobs text[], outbox_versions bigint[], outbox_payloads text[], outbox_at float8[],
                started_jobs text[], started_attempts bigint[], started_workers text[], started_times float8[],
                ended_jobs text[], ended_attempts bigint[], ended_times float8[], ended_outcomes text[], ended_errors text[])
            RETURNS void
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
            #variable_conflict use_column
            BEGIN
                WITH updated AS (
                    UPDATE jobs_job j SET status = r.status, progress = r.progress, attempts = r.attempts, last_error = r.last_error,
                        result_key = r.result_key, thumbnail_key = r.thumbnail_key, updated_at = r.updated_at, started_at = r.started_at,
                        finished_at = r.finished_at, version = r.version, cancel_requested = r.cancel_requested, submission = r.submission,
                        history_due_at = r.updated_at, history_attempts = 0
                    FROM jsonb_populate_recordset(NULL::jobs_job, changed) AS r
                    WHERE j.id = r.id AND j.id = ANY(changed_ids)
                ), queued AS (
                    INSERT INTO jobs_outbox (topic, kind, job_id, version, payload, created_at, next_attempt_at)
                    SELECT o.topic, o.kind, o.job_id, o.version, CASE WHEN o.payload = '' THEN NULL ELSE convert_to(o.payload, 'UTF8') END, o.at, o.at
                    FROM unnest(outbox_topics, outbox_kinds, outbox_jobs, outbox_versions, outbox_payloads, outbox_at)
                        WITH ORDINALITY AS o(topic, kind, job_id, version, payload, at, n)
                    ORDER BY o.n
                ), begun AS (
                    INSERT INTO jobs_attempt (job_id, attempt, worker_id, started_at)
                    SELECT s.j, s.n, NULLIF(s.w, ''), s.t FROM unnest(started_jobs, started_attempts, started_workers, started_times) AS s(j, n, w, t)
                    ORDER BY s.j, s.n
                    ON CONFLICT (job_id, attempt) DO UPDATE SET worker_id = excluded.worker_id, started_at = excluded.started_at, ended_at = NULL, outcome = NULL, error = NULL
                )
                UPDATE jobs_attempt a SET ended_at = e.at, outcome = e.outcome, error = NULLIF(e.error, '')
                FROM unnest(ended_jobs, ended_attempts, ended_times, ended_outcomes, ended_errors) AS e(job_id, attempt, at, outcome, error)
                WHERE a.job_id = e.job_id AND a.attempt = e.attempt AND a.ended_at IS NULL AND a.job_id = ANY(ended_jobs);
            END
            $fn$
            """,
        ]),
        // The fence and the rows of a dispatch batch (`lockedRows`), planned once per connection
        // as v11's writes are: the statement was parsed and planned at every batch, and planning
        // took as long as running it (0.13 ms each a batch in bench-jobs, `pg_stat_statements`
        // with `track_planning`).
        PostgresMigration("v12: the dispatcher's batch reads its fence and rows in a function, planned once, by primary key", [
            """
            CREATE FUNCTION jobs_locked_rows(lease_holder text, lease_term bigint, ids text[]) RETURNS SETOF jobs_job
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
            BEGIN
                PERFORM FROM jobs_leader AS l WHERE l.name = 'dispatcher' AND l.holder = lease_holder AND l.term = lease_term FOR SHARE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'the dispatcher''s lease is no longer held under term %', lease_term USING ERRCODE = 'PJ001';
                END IF;
                RETURN QUERY SELECT * FROM jobs_job WHERE id = ANY(ids) ORDER BY id FOR UPDATE;
            END
            $fn$
            """,
        ]),
        // A batch of creations in one call (`PostgresJobsStore+Creations.swift`): three statements,
        // each parsed and planned at every batch (0.4 ms of planning a batch in bench-jobs,
        // `pg_stat_statements` with `track_planning`), and two round trips more.
        PostgresMigration("v13: a batch of creations in a function, planned once, by primary key", [
            """
            CREATE FUNCTION jobs_create(ids text[], new_rows jsonb) RETURNS TABLE(existing jobs_job, abandoned text)
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
            DECLARE
                taken text[] := '{}';
                hit record;
            BEGIN
                PERFORM pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext('jobs:job:' || k) AS h FROM unnest(ids) AS k ORDER BY h) AS ordered;
                FOR hit IN SELECT k.wanted, j AS job, a.job_id AS gone FROM unnest(ids) AS k(wanted)
                    LEFT JOIN jobs_job AS j ON j.id = k.wanted LEFT JOIN jobs_abandoned AS a ON a.job_id = k.wanted
                    WHERE j.id IS NOT NULL OR a.job_id IS NOT NULL
                LOOP
                    taken := taken || hit.wanted;
                    existing := hit.job;
                    abandoned := hit.gone;
                    RETURN NEXT;
                END LOOP;
                INSERT INTO jobs_job (id, user_id, is_pro, image_key, effect_id, parameters, prompt, status, progress, attempts, max_attempts,
                    last_error, result_key, thumbnail_key, created_at, updated_at, started_at, finished_at, version, cancel_requested, credits,
                    submission, trace_parent, image_etag, history_due_at)
                SELECT r.id, r.user_id, r.is_pro, r.image_key, r.effect_id, r.parameters, r.prompt, r.status, r.progress, r.attempts,
                    r.max_attempts, r.last_error, r.result_key, r.thumbnail_key, r.created_at, r.updated_at, r.started_at, r.finished_at,
                    r.version, r.cancel_requested, r.credits, r.submission, r.trace_parent, r.image_etag, r.history_due_at
                FROM jsonb_populate_recordset(NULL::jobs_job, new_rows) AS r
                WHERE r.id <> ALL(taken)
                ORDER BY r.id;
            END
            $fn$
            """,
        ]),
    ]

    // MARK: Any replica

    public func create(_ request: CreateJob, effectId: String, parameters: [String: Double], now: Date) async throws -> (job: JobRecord, created: Bool) {
        let created = try await creations.submit(Creation(request: request, effectId: effectId, parameters: parameters, now: now))
        return (created.job, created.created)
    }

    public func lookup(_ id: String, abandonIfAbsent: Bool, now: Date) async throws -> JobStatus? {
        guard abandonIfAbsent else { return try await job(id, userId: nil)?.status }
        let store = self
        return try await database.transaction { db in
            try await store.lockId(db, id)
            if let job = try await store.row(db, id, lock: false) { return job.status }
            // Purged, its settlement not yet delivered: the job ended as that settlement says.
            if let settlement = try await db.first(
                "SELECT kind FROM jobs_outbox WHERE topic = 'quota' AND job_id = \(id) ORDER BY id DESC LIMIT 1", as: String.self, logger: store.logger
            ) {
                return JobRules.Settlement(rawValue: settlement) == .commit ? .completed : .failed
            }
            try await db.query(
                "INSERT INTO jobs_abandoned (job_id, at) VALUES (\(id), \(now.timeIntervalSince1970)) ON CONFLICT DO NOTHING", logger: store.logger
            )
            return nil
        }
    }

    public func job(_ id: String, userId: String?) async throws -> JobRecord? {
        let store = self
        let job = try await database.connection { db in try await store.row(db, id, lock: false) }
        if let userId, job?.userId != userId { return nil }
        return job
    }

    public func jobs(_ ids: [String]) async throws -> [JobRecord] {
        guard !ids.isEmpty else { return [] }
        let store = self
        return try await database.connection { db in
            try await store.rows(db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE id = ANY(\(ids))")
        }
    }

    public func states(_ ids: [String]) async throws -> [String: JobState] {
        guard !ids.isEmpty else { return [:] }
        let logger = logger
        let rows = try await database.connection { db in
            try await db.allRows(
                "SELECT id, user_id, version, status, progress FROM jobs_job WHERE id = ANY(\(ids))",
                as: (String, String, Int, String, Double).self, logger: logger
            )
        }
        var states: [String: JobState] = [:]
        for (id, userId, version, status, progress) in rows {
            states[id] = JobState(userId: userId, version: version, status: JobStatus(rawValue: status) ?? .queued, progress: progress)
        }
        return states
    }

    public func counts() async throws -> JobCounts {
        let logger = logger
        return try await database.transaction(.snapshotRead) { db in
            var counts = JobCounts()
            for (status, count) in try await db.allRows("SELECT status, count(*) FROM jobs_job GROUP BY status", as: (String, Int).self, logger: logger) {
                if let status = JobStatus(rawValue: status) { counts.states[status] = count }
            }
            for (topic, count) in try await db.allRows("SELECT topic, count(*) FROM jobs_outbox GROUP BY topic", as: (String, Int).self, logger: logger) {
                counts.outbox[topic] = count
            }
            counts.outbox[OutboxEntry.Topic.history] = try await db.first(
                "SELECT count(*) FROM jobs_job WHERE history_due_at IS NOT NULL", as: Int.self, logger: logger
            )
            let oldest = try await db.allRows(
                "SELECT created_at FROM jobs_job WHERE status = 'queued' ORDER BY created_at LIMIT 1", as: Double.self, logger: logger
            )
            counts.oldestQueued = oldest.first.map { Date(timeIntervalSince1970: $0) }
            return counts
        }
    }

    public func cancel(_ id: String, userId: String, now: Date) async throws -> JobRecord {
        try await write { store, db in
            guard let job = try await store.row(db, id, lock: true), job.userId == userId else { throw BusError(.notFound, "no job \(id)") }
            switch JobRules.cancel(job, now: now) {
            case .alreadyFinished(let status):
                throw BusError(Jobs.ErrorCode.alreadyFinished, "job \(id) has already \(status.rawValue)")
            case .unchanged(let job):
                return job
            case .mark(let marked):
                // Not a state change: history hears of it when the worker's `cancelled` ends the job.
                try await store.update(db, marked, announce: false)
                return marked
            case .apply(let transition):
                try await store.apply(db, transition)
                return transition.job
            }
        }
    }

    public func purge(_ id: String, userId: String, now: Date) async throws -> PurgedJob {
        try await write { store, db in
            guard let job = try await store.row(db, id, lock: true), job.userId == userId else { return PurgedJob(job: nil) }
            // A job that has not ended gives its charge back, as a cancel would.
            if let settlement = JobRules.purgeSettlement(job) { try await store.settle(db, job: job, settlement, now: now) }
            try await db.query("DELETE FROM jobs_job WHERE id = \(id)", logger: store.logger)
            try await db.query("DELETE FROM jobs_attempt WHERE job_id = \(id)", logger: store.logger)
            var keys = [job.resultKey, job.thumbnailKey].compactMap { $0 }
            let sharing = try await db.first(
                "SELECT count(*) FROM jobs_job WHERE user_id = \(userId) AND image_key = \(job.imageKey)", as: Int.self, logger: store.logger
            ) ?? 0
            if sharing == 0 { keys.append(job.imageKey) }
            try await store.discardBlobs(db, keys, jobId: id, now: now)
            return PurgedJob(job: job)
        }
    }

    public func unused(_ keys: [String]) async throws -> [String] {
        guard !keys.isEmpty else { return [] }
        let logger = logger
        let used = try await database.connection { db in
            Set(try await db.all("SELECT DISTINCT image_key FROM jobs_job WHERE image_key = ANY(\(keys))", as: String.self, logger: logger))
        }
        return keys.filter { !used.contains($0) }
    }

    // MARK: The dispatcher's (fenced)

    public func recordSubmission(_ attempt: JobAttempt, _ request: ProviderRequest) async throws -> JobReportOutcome {
        try await write(fenced: true) { store, db in
            guard let job = try await store.row(db, attempt.jobId, lock: true) else { return .refused("no such job") }
            switch JobRules.submitted(job, attempt, request) {
            case .refuse(let reason): return .refused(reason)
            case .alreadyRecorded(let job): return .alreadyRecorded(job)
            case .apply(let transition):
                try await store.update(db, transition.job, announce: false)
                return .applied(transition.job)
            }
        }
    }

    public func processingAttempts() async throws -> [JobAttempt] {
        let logger = logger
        return try await database.connection { db in
            try await db.allRows("SELECT id, attempts FROM jobs_job WHERE status = 'processing'", as: (String, Int).self, logger: logger)
                .map { JobAttempt(jobId: $0.0, attempt: $0.1) }
        }
    }

    public func discardOutput(_ output: JobOutput, of attempt: JobAttempt, now: Date) async throws {
        try await write { store, db in
            let job = try await store.row(db, attempt.jobId, lock: false)
            let keys = [output.resultKey, output.thumbnailKey].filter { $0 != job?.resultKey && $0 != job?.thumbnailKey }
            try await store.discardBlobs(db, keys, jobId: attempt.jobId, now: now)
        }
    }

    public func recover(now: Date) async throws -> [JobRecord] {
        try await write(fenced: true) { store, db in
            let orphans = try await store.rows(
                db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE status = 'processing' AND cancel_requested FOR UPDATE"
            )
            for job in orphans {
                if let transition = JobRules.recover(job, now: now) { try await store.apply(db, transition) }
            }
            return try await store.rows(db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE status = 'queued' ORDER BY created_at")
        }
    }

    /// The queued jobs (ids and what the fair queue needs), for a leader's resync with the table.
    public func queued() async throws -> [JobRecord] {
        let store = self
        return try await database.connection { db in
            try await store.rows(db, "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE status = 'queued' ORDER BY created_at")
        }
    }

    /// Stores the live progress of running jobs (fenced; not a state change: no version, no
    /// event), so that every replica answers the same progress.
    public func saveProgress(_ progress: [String: Double]) async throws {
        guard !progress.isEmpty else { return }
        let (ids, fractions) = (Array(progress.keys), progress.keys.map { progress[$0] ?? 0 })
        try await write(fenced: true) { store, db in
            _ = try await db.query(
                """
                UPDATE jobs_job j SET progress = p.fraction FROM unnest(\(ids)::text[], \(fractions)::float8[]) AS p(id, fraction)
                WHERE j.id = p.id AND j.status = 'processing' AND j.progress < p.fraction
                """,
                logger: store.logger
            )
        }
    }

    // MARK: Transactions

    /// A write, in one transaction; with `fenced`, refused (`DispatchDeposed`) unless this
    /// store's lease still holds.
    func write<T: Sendable>(fenced: Bool = false, _ body: @escaping @Sendable (PostgresJobsStore, PostgresConnection) async throws -> T) async throws -> T {
        let store = self
        return try await database.transaction { db in
            if fenced, let lease = store.fence {
                let term = try await db.first(
                    "SELECT term FROM jobs_leader WHERE name = 'dispatcher' AND holder = \(lease.holder) FOR SHARE", as: Int64.self, logger: store.logger
                )
                guard term == lease.term else { throw DispatchDeposed(term: lease.term) }
            }
            return try await body(store, db)
        }
    }

    public func report(_ attempt: JobAttempt, _ decide: @escaping @Sendable (JobRecord) -> JobRules.Decision) async throws -> (outcome: JobReportOutcome, retryAfter: Duration?) {
        try await write(fenced: true) { store, db in
            guard let job = try await store.row(db, attempt.jobId, lock: true) else { return (.refused("no such job"), nil) }
            switch decide(job) {
            case .refuse(let reason): return (.refused(reason), nil)
            case .alreadyRecorded(let recorded): return (.alreadyRecorded(recorded), nil)
            case .apply(let transition):
                try await store.apply(db, transition)
                return (.applied(transition.job), transition.retryAfter)
            }
        }
    }

    /// Serialises a creation with an abandoning lookup of the same id, across replicas.
    func lockId(_ db: PostgresConnection, _ id: String) async throws {
        try await db.query("SELECT pg_advisory_xact_lock(hashtext(\("jobs:job:" + id)))", logger: logger)
    }

    /// Writes a transition: the row, due for history, and its quota settlement.
    func apply(_ db: PostgresConnection, _ transition: JobRules.Transition) async throws {
        try await update(db, transition.job, announce: true)
        if let settlement = transition.settlement {
            try await settle(db, job: transition.job, settlement, now: transition.job.updatedAt)
            try await notify(db, [transition.job])
        }
    }

    func discardBlobs(_ db: PostgresConnection, _ keys: [String], jobId: String, now: Date) async throws {
        guard !keys.isEmpty else { return }
        try await insertOutbox(db, topic: OutboxEntry.Topic.blobs, kind: "delete", jobId: jobId, version: 0, payload: try JSONEncoder().encode(keys), now: now)
    }

    func settle(_ db: PostgresConnection, job: JobRecord, _ settlement: JobRules.Settlement, now: Date) async throws {
        try await insertOutbox(db, topic: OutboxEntry.Topic.quota, kind: settlement.rawValue, jobId: job.id, version: job.version, payload: nil, now: now)
    }

    func insertOutbox(_ db: PostgresConnection, topic: String, kind: String, jobId: String, version: Int, payload: Data?, now: Date) async throws {
        let stamp = now.timeIntervalSince1970
        try await db.query(
            """
            INSERT INTO jobs_outbox (topic, kind, job_id, version, payload, created_at, next_attempt_at)
            VALUES (\(topic), \(kind), \(jobId), \(version), \(payload), \(stamp), \(stamp))
            """,
            logger: logger
        )
    }

    // MARK: Attempts

    /// How an attempt ended, as the attempts table keeps it.
    struct EndedAttempt {
        var jobId: String
        var attempt: Int
        var at: Double
        var outcome: String
        var error: String?

        init(_ job: JobRecord, outcome: String) {
            jobId = job.id
            attempt = job.attempts
            at = job.updatedAt.timeIntervalSince1970
            self.outcome = outcome
            error = job.status == .completed ? nil : job.lastError
        }
    }

    // MARK: Rows

    /// As `JobRows.columns` (as many, in the same order: `JobRows.columnCount`).
    static let columns = """
        id, user_id, is_pro, image_key, effect_id, parameters, prompt, status, progress, attempts, max_attempts, last_error, result_key,
        thumbnail_key, created_at, updated_at, started_at, finished_at, version, cancel_requested, credits, submission, trace_parent,
        image_etag
        """

    func row(_ db: PostgresConnection, _ id: String, lock: Bool) async throws -> JobRecord? {
        try await rows(db, lock ? "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE id = \(id) FOR UPDATE"
                                : "SELECT \(unescaped: Self.columns) FROM jobs_job WHERE id = \(id)").first
    }

    func rows(_ db: PostgresConnection, _ query: PostgresQuery) async throws -> [JobRecord] {
        var jobs: [JobRecord] = []
        for try await row in try await db.query(query, logger: logger) { jobs.append(try Self.job(row)) }
        return jobs
    }

    func insert(_ db: PostgresConnection, _ job: JobRecord) async throws {
        try await db.query(
            """
            INSERT INTO jobs_job (\(unescaped: Self.columns), history_due_at) VALUES (\(job.id), \(job.userId), \(job.isPro), \(job.imageKey), \(job.effectId),
                \(try JobRows.text(job.parameters)), \(job.prompt), \(job.status.rawValue), \(job.progress), \(job.attempts), \(job.maxAttempts),
                \(job.lastError), \(job.resultKey), \(job.thumbnailKey), \(job.createdAt.timeIntervalSince1970), \(job.updatedAt.timeIntervalSince1970),
                \(job.startedAt?.timeIntervalSince1970), \(job.finishedAt?.timeIntervalSince1970), \(job.version), \(job.cancelRequested),
                \(job.credits), \(try JobRows.text(job.submission)), \(job.traceParent), \(job.imageETag), \(job.updatedAt.timeIntervalSince1970))
            """,
            logger: logger
        )
    }

    /// Writes what a change may change (everything but the request the job was made from). A
    /// state change (`announce`: its version was bumped) makes the row due for history at once.
    func update(_ db: PostgresConnection, _ job: JobRecord, announce: Bool) async throws {
        // Due now when announced; otherwise what was due stays (the column set to itself).
        let due: Double? = announce ? job.updatedAt.timeIntervalSince1970 : nil
        try await db.query(
            """
            UPDATE jobs_job SET status = \(job.status.rawValue), progress = \(job.progress), attempts = \(job.attempts), max_attempts = \(job.maxAttempts), last_error = \(job.lastError),
                result_key = \(job.resultKey), thumbnail_key = \(job.thumbnailKey), updated_at = \(job.updatedAt.timeIntervalSince1970),
                started_at = \(job.startedAt?.timeIntervalSince1970), finished_at = \(job.finishedAt?.timeIntervalSince1970), version = \(job.version),
                cancel_requested = \(job.cancelRequested), submission = \(try JobRows.text(job.submission)),
                history_due_at = CASE WHEN \(announce) THEN \(due) ELSE history_due_at END,
                history_attempts = CASE WHEN \(announce) THEN 0 ELSE history_attempts END
            WHERE id = \(job.id)
            """,
            logger: logger
        )
        if announce, job.attempts > 0, let outcome = AttemptRecord.outcome(of: job.status) {
            try await writeChanges(db, ended: [EndedAttempt(job, outcome: outcome)])
        }
    }

    static func job(_ row: PostgresRow) throws -> JobRecord {
        let row = row.makeRandomAccess()
        let status = try row[7].decode(String.self)
        guard let state = JobStatus(rawValue: status) else {
            throw PostgresLocationError(description: "job \(try row[0].decode(String.self)) has the unknown status \(status)")
        }
        func date(_ index: Int) throws -> Date? { try row[index].decode(Double?.self).map(Date.init(timeIntervalSince1970:)) }
        return JobRecord(
            id: try row[0].decode(String.self), userId: try row[1].decode(String.self), isPro: try row[2].decode(Bool.self),
            imageKey: try row[3].decode(String.self), effectId: try row[4].decode(String.self),
            parameters: try JobRows.parameters(try row[5].decode(String.self)), prompt: try row[6].decode(String?.self), status: state,
            progress: try row[8].decode(Double.self), attempts: try row[9].decode(Int.self), maxAttempts: try row[10].decode(Int.self),
            lastError: try row[11].decode(String?.self), resultKey: try row[12].decode(String?.self), thumbnailKey: try row[13].decode(String?.self),
            createdAt: try date(14) ?? Date(timeIntervalSince1970: 0), updatedAt: try date(15) ?? Date(timeIntervalSince1970: 0),
            startedAt: try date(16), finishedAt: try date(17), version: try row[18].decode(Int.self), cancelRequested: try row[19].decode(Bool.self),
            credits: try row[20].decode(Int.self), submission: try JobRows.submission(try row[21].decode(String?.self)),
            traceParent: try row[22].decode(String?.self), imageETag: try row[23].decode(String?.self)
        )
    }
}

/// A write of a dispatcher whose lease another replica has taken: refused, nothing changed.
public struct DispatchDeposed: Error, CustomStringConvertible {
    public var term: Int64
    public var description: String { "this replica's dispatcher lease (term \(term)) was taken over: its writes change nothing" }
}

/// One topic of the jobs outbox on PostgreSQL, shared by every replica's relay: `due` claims the
/// entries it returns for `lease` (so another replica's relay skips them), `acknowledge` deletes
/// them, `retry` sets their next attempt; entries of a relay that died are due again after the
/// lease.
public struct PostgresJobsOutbox: Outbox {
    let database: PostgresPool
    let topic: String
    let lease: Duration
    let logger: Logger

    public init(store: PostgresJobsStore, topic: String, lease: Duration = .seconds(30)) {
        self.database = store.database
        self.topic = topic
        self.lease = lease
        self.logger = store.logger
    }

    public func due(now: Date, limit: Int) async throws -> [OutboxItem<JobsOutboxKind>] {
        let (topic, logger) = (topic, logger)
        let claimedUntil = now.timeIntervalSince1970 + Double(lease.components.seconds)
        return try await database.transaction { db in
            try await db.allRows(
                """
                UPDATE jobs_outbox SET next_attempt_at = \(claimedUntil) WHERE id IN (
                    SELECT id FROM jobs_outbox WHERE topic = \(topic) AND next_attempt_at <= \(now.timeIntervalSince1970)
                    ORDER BY next_attempt_at, id LIMIT \(limit) FOR UPDATE SKIP LOCKED)
                RETURNING id, kind, job_id, attempts, payload
                """,
                as: (Int64, String, String, Int, Data?).self, logger: logger
            )
            .sorted { $0.0 < $1.0 }
            .map { OutboxItem(id: String($0.0), kind: JobsOutbox.kind(topic: topic, kind: $0.1, payload: $0.4), jobId: $0.2, attempts: $0.3) }
        }
    }

    public func acknowledge(_ ids: [String]) async throws {
        let keys = ids.compactMap { Int64($0) }
        let logger = logger
        try await database.connection { db in _ = try await db.query("DELETE FROM jobs_outbox WHERE id = ANY(\(keys))", logger: logger) }
    }

    public func retry(_ entries: [OutboxRetry]) async throws {
        let readable = entries.compactMap { entry in Int64(entry.id).map { (key: $0, entry: entry) } }
        guard !readable.isEmpty else { return }
        let keys = readable.map(\.key), attempts = readable.map { $0.entry.attempts }, times = readable.map { $0.entry.at.timeIntervalSince1970 }
        let logger = logger
        try await database.connection { db in
            _ = try await db.query(
                """
                UPDATE jobs_outbox o SET attempts = a.attempts, next_attempt_at = a.at
                FROM unnest(\(keys)::bigint[], \(attempts)::bigint[], \(times)::float8[]) AS a(id, attempts, at) WHERE o.id = a.id
                """,
                logger: logger
            )
        }
    }
}

/// History's events on PostgreSQL, read from the job rows as `JobsHistoryFeed` reads them on
/// SQLite, and shared by every replica's relay as the outbox is: `due` claims the rows it returns
/// for `lease` (their due time moved past it, so another relay skips them; a state change made
/// meanwhile makes its row due again at once), `acknowledge` clears a row still at the version
/// delivered, and a relay that died leaves its rows due again after the lease.
public struct PostgresJobsHistoryFeed: Outbox {
    let database: PostgresPool
    let effectTitles: [String: String]
    let lease: Duration
    let logger: Logger

    public init(store: PostgresJobsStore, lease: Duration = .seconds(30)) {
        self.database = store.database
        self.effectTitles = store.effectTitles
        self.lease = lease
        self.logger = store.logger
    }

    public func due(now: Date, limit: Int) async throws -> [OutboxItem<JobsOutboxKind>] {
        let (effectTitles, logger) = (effectTitles, logger)
        let claimedUntil = now.timeIntervalSince1970 + Double(lease.components.seconds)
        return try await database.transaction { db in
            var items: [(due: Double, item: OutboxItem<JobsOutboxKind>)] = []
            let rows = try await db.query(
                """
                WITH due AS (
                    SELECT id AS due_id, history_due_at AS was_due FROM jobs_job
                    WHERE history_due_at IS NOT NULL AND history_due_at <= \(now.timeIntervalSince1970)
                    ORDER BY history_due_at LIMIT \(limit) FOR UPDATE SKIP LOCKED)
                UPDATE jobs_job SET history_due_at = \(claimedUntil) FROM due WHERE id = due_id
                RETURNING \(unescaped: PostgresJobsStore.columns), history_attempts, was_due
                """,
                logger: logger
            )
            for try await row in rows {
                let columns = row.makeRandomAccess()
                let attempts = try columns[JobRows.columnCount].decode(Int.self)
                let due = try columns[JobRows.columnCount + 1].decode(Double.self)
                do {
                    items.append((due, HistoryFeedItem.item(try PostgresJobsStore.job(row), effectTitles: effectTitles, attempts: attempts)))
                } catch {
                    let item = HistoryFeedItem.unreadable(jobId: try columns[0].decode(String.self), version: try columns[18].decode(Int.self), attempts: attempts)
                    items.append((due, item))
                }
            }
            return items.sorted { $0.due < $1.due }.map(\.item)
        }
    }

    public func acknowledge(_ ids: [String]) async throws {
        let versions = ids.compactMap(HistoryFeedItem.parse)
        guard !versions.isEmpty else { return }
        let (jobIds, numbers, logger) = (versions.map(\.jobId), versions.map(\.version), logger)
        try await database.connection { db in
            _ = try await db.query(
                """
                UPDATE jobs_job j SET history_due_at = NULL, history_attempts = 0
                FROM unnest(\(jobIds)::text[], \(numbers)::bigint[]) AS a(id, version) WHERE j.id = a.id AND j.version = a.version
                """,
                logger: logger
            )
        }
    }

    public func retry(_ entries: [OutboxRetry]) async throws {
        let readable = entries.compactMap { entry in HistoryFeedItem.parse(entry.id).map { (item: $0, entry: entry) } }
        guard !readable.isEmpty else { return }
        let jobIds = readable.map(\.item.jobId), versions = readable.map { Int64($0.item.version) }
        let attempts = readable.map { $0.entry.attempts }, times = readable.map { $0.entry.at.timeIntervalSince1970 }
        let logger = logger
        try await database.connection { db in
            _ = try await db.query(
                """
                UPDATE jobs_job j SET history_attempts = a.attempts, history_due_at = a.at
                FROM unnest(\(jobIds)::text[], \(versions)::bigint[], \(attempts)::bigint[], \(times)::float8[]) AS a(id, version, attempts, at)
                WHERE j.id = a.id AND j.version = a.version
                """,
                logger: logger
            )
        }
    }
}
