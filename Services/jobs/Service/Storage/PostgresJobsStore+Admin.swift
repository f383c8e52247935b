import Foundation
import JobsCore
import Messages
import PostgresNIO
import Storage

/// What operators read and do across users, on PostgreSQL.
extension PostgresJobsStore {
    public func adminJobs(_ filter: AdminJobFilter, effectIds: [String]?, after cursor: AdminCursor?, limit: Int) async throws -> [JobRecord] {
        let store = self
        let state = filter.state?.rawValue, pattern = filter.error.map(AdminCursor.likePattern)
        let from = filter.from?.timeIntervalSince1970, to = filter.to?.timeIntervalSince1970
        let after = cursor?.createdAt.timeIntervalSince1970, afterId = cursor?.id
        return try await database.connection { db in
            try await store.rows(db, """
                SELECT \(unescaped: Self.columns) FROM jobs_job
                WHERE (\(state)::text IS NULL OR status = \(state)) AND (\(filter.effect)::text IS NULL OR effect_id = \(filter.effect))
                  AND (\(filter.userId)::text IS NULL OR user_id = \(filter.userId))
                  AND (\(pattern)::text IS NULL OR last_error ILIKE '%' || \(pattern) || '%')
                  AND (\(from)::float8 IS NULL OR created_at >= \(from)) AND (\(to)::float8 IS NULL OR created_at < \(to))
                  AND (\(effectIds)::text[] IS NULL OR effect_id = ANY(\(effectIds)))
                  AND (\(after)::float8 IS NULL OR created_at < \(after) OR (created_at = \(after) AND id < \(afterId)))
                ORDER BY created_at DESC, id DESC LIMIT \(limit)
                """)
        }
    }

    public func retry(_ id: String, attempts: Int, now: Date) async throws -> JobRetryOutcome {
        try await write { store, db in
            guard let job = try await store.row(db, id, lock: true) else { return .notFailed(nil) }
            guard let transition = JobRules.retry(job, attempts: attempts, now: now) else { return .notFailed(job.status) }
            let pending = try await db.first("SELECT count(*) FROM jobs_outbox WHERE topic = 'quota' AND job_id = \(id)", as: Int.self, logger: store.logger) ?? 0
            if pending > 0 { return .settling }
            try await store.update(db, transition.job, announce: true)
            return .retried(transition.job)
        }
    }

    public func attempts(of jobId: String) async throws -> [AttemptRecord] {
        let logger = logger
        return try await database.connection { db in
            var attempts: [AttemptRecord] = []
            for try await (attempt, worker, started, ended, outcome, error) in try await db.query("""
                SELECT attempt, worker_id, started_at, ended_at, outcome, error FROM jobs_attempt WHERE job_id = \(jobId) ORDER BY attempt
                """, logger: logger).decode((Int, String?, Double, Double?, String?, String?).self) {
                attempts.append(AttemptRecord(attempt: attempt, workerId: worker, startedAt: Date(timeIntervalSince1970: started),
                                              endedAt: ended.map(Date.init(timeIntervalSince1970:)), outcome: outcome, error: error))
            }
            return attempts
        }
    }

    public func dispatchControls() async throws -> DispatchControls {
        let logger = logger
        let body = try await database.connection { db in
            try await db.first("SELECT body FROM jobs_dispatch_controls WHERE id = 1", as: String.self, logger: logger)
        }
        guard let body else { return DispatchControls() }
        return try JSONDecoder().decode(DispatchControls.self, from: Data(body.utf8))
    }

    public func changeDispatchControls(_ change: DispatchControls.Change) async throws -> (controls: DispatchControls, changed: Bool) {
        try await write { store, db in
            // One change at a time, the row there or not yet.
            try await db.query("SELECT pg_advisory_xact_lock(hashtext('jobs:dispatch-controls'))", logger: store.logger)
            let body = try await db.first("SELECT body FROM jobs_dispatch_controls WHERE id = 1", as: String.self, logger: store.logger)
            let current = try body.map { try JSONDecoder().decode(DispatchControls.self, from: Data($0.utf8)) } ?? DispatchControls()
            guard let next = current.applying(change) else { return (current, false) }
            let text = String(decoding: try JSONEncoder().encode(next), as: UTF8.self)
            try await db.query("""
                INSERT INTO jobs_dispatch_controls (id, body) VALUES (1, \(text)) ON CONFLICT (id) DO UPDATE SET body = excluded.body
                """, logger: store.logger)
            return (next, true)
        }
    }

    public func activeByEffect() async throws -> [EffectLoad] {
        let logger = logger
        return try await database.connection { db in
            var loads: [EffectLoad] = []
            for try await (effect, queued, processing, oldest) in try await db.query("""
                SELECT effect_id, count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'processing'),
                       min(created_at) FILTER (WHERE status = 'queued')
                FROM jobs_job WHERE status IN ('queued', 'processing') GROUP BY effect_id ORDER BY effect_id
                """, logger: logger).decode((String, Int, Int, Double?).self) {
                loads.append(EffectLoad(effectId: effect, queued: queued, processing: processing, oldestQueuedAt: oldest.map(Date.init(timeIntervalSince1970:))))
            }
            return loads
        }
    }

    public func appendAudit(_ entry: AuditEntry) async throws {
        _ = try await write { store, db in
            try await db.query("""
                INSERT INTO jobs_audit (at, actor, action, target, filter, count, detail)
                VALUES (\(entry.at.timeIntervalSince1970), \(entry.actor), \(entry.action), \(entry.target), \(entry.filter), \(entry.count), \(entry.detail))
                """, logger: store.logger)
        }
    }

    public func auditLog(before: Int64?, limit: Int) async throws -> [AuditEntry] {
        let logger = logger
        return try await database.connection { db in
            var entries: [AuditEntry] = []
            let rows = try await db.query("""
                SELECT id, at, actor, action, target, filter, count, detail FROM jobs_audit
                WHERE (\(before)::bigint IS NULL OR id < \(before)) ORDER BY id DESC LIMIT \(limit)
                """, logger: logger)
            for try await (id, at, actor, action, target, filter, count, detail) in rows.decode((Int64, Double, String, String, String, String?, Int, String?).self) {
                entries.append(AuditEntry(id: id, at: Date(timeIntervalSince1970: at), actor: actor, action: action, target: target, filter: filter,
                                          count: count, detail: detail))
            }
            return entries
        }
    }
}
