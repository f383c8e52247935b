import Foundation
import JobsCore
import GRDB
import Messages
import Storage

/// What operators read and do across users, on SQLite.
extension SQLiteJobsStore {
    public func adminJobs(_ filter: AdminJobFilter, effectIds: [String]?, after cursor: AdminCursor?, limit: Int) async throws -> [JobRecord] {
        try await database.read { db in
            let rows = try Row.fetchAll(db, sql: """
                SELECT \(JobRows.columns) FROM job
                WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR effectId = ?2) AND (?3 IS NULL OR userId = ?3)
                  AND (?4 IS NULL OR lastError LIKE '%' || ?4 || '%' ESCAPE '\\')
                  AND (?5 IS NULL OR createdAt >= ?5) AND (?6 IS NULL OR createdAt < ?6)
                  AND (?7 IS NULL OR effectId IN (SELECT value FROM json_each(?7)))
                  AND (?8 IS NULL OR createdAt < ?8 OR (createdAt = ?8 AND id < ?9))
                ORDER BY createdAt DESC, id DESC LIMIT ?10
                """, arguments: [
                    filter.state?.rawValue, filter.effect, filter.userId, filter.error.map(AdminCursor.likePattern),
                    filter.from.map(StoredDate.text), filter.to.map(StoredDate.text), effectIds.map(JobRows.jsonArray),
                    cursor.map { StoredDate.text($0.createdAt) }, cursor?.id, limit,
                ])
            return try rows.map(JobRows.job)
        }
    }

    public func retry(_ id: String, attempts: Int, now: Date) async throws -> JobRetryOutcome {
        try await database.write { db in
            guard let job = try JobRows.job(db, id) else { return .notFailed(nil) }
            guard let transition = JobRules.retry(job, attempts: attempts, now: now) else { return .notFailed(job.status) }
            if try Bool.fetchOne(db, sql: "SELECT 1 FROM outbox WHERE topic = 'quota' AND jobId = ?", arguments: [id]) == true { return .settling }
            try JobRows.update(db, transition.job, announce: true)
            return .retried(transition.job)
        }
    }

    public func attempts(of jobId: String) async throws -> [AttemptRecord] {
        try await database.read { db in
            try Row.fetchAll(db, sql: "SELECT attempt, workerId, startedAt, endedAt, outcome, error FROM attempt WHERE jobId = ? ORDER BY attempt", arguments: [jobId])
                .map { AttemptRecord(attempt: $0["attempt"], workerId: $0["workerId"], startedAt: $0["startedAt"], endedAt: $0["endedAt"], outcome: $0["outcome"], error: $0["error"]) }
        }
    }

    public func dispatchControls() async throws -> DispatchControls {
        try await database.read { db in try Self.controls(db) }
    }

    public func changeDispatchControls(_ change: DispatchControls.Change) async throws -> (controls: DispatchControls, changed: Bool) {
        try await database.write { db in
            let current = try Self.controls(db)
            guard let next = current.applying(change) else { return (current, false) }
            try db.execute(sql: "INSERT INTO dispatch_controls (id, body) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                           arguments: [String(decoding: try JSONEncoder().encode(next), as: UTF8.self)])
            return (next, true)
        }
    }

    static func controls(_ db: Database) throws -> DispatchControls {
        guard let body = try String.fetchOne(db, sql: "SELECT body FROM dispatch_controls WHERE id = 1") else { return DispatchControls() }
        return try JSONDecoder().decode(DispatchControls.self, from: Data(body.utf8))
    }

    public func activeByEffect() async throws -> [EffectLoad] {
        try await database.read { db in
            try Row.fetchAll(db, sql: """
                SELECT effectId, SUM(status = 'queued') AS queued, SUM(status = 'processing') AS processing,
                       MIN(CASE WHEN status = 'queued' THEN createdAt END) AS oldest
                FROM job WHERE status IN ('queued', 'processing') GROUP BY effectId ORDER BY effectId
                """).map { row in
                EffectLoad(effectId: row["effectId"], queued: row["queued"], processing: row["processing"], oldestQueuedAt: row["oldest"])
            }
        }
    }

    public func appendAudit(_ entry: AuditEntry) async throws {
        try await database.write { db in
            try db.execute(sql: "INSERT INTO audit (at, actor, action, target, filter, count, detail) VALUES (?, ?, ?, ?, ?, ?, ?)", arguments: [
                StoredDate.text(entry.at), entry.actor, entry.action, entry.target, entry.filter, entry.count, entry.detail,
            ])
        }
    }

    public func auditLog(before: Int64?, limit: Int) async throws -> [AuditEntry] {
        try await database.read { db in
            try Row.fetchAll(db, sql: """
                SELECT id, at, actor, action, target, filter, count, detail FROM audit WHERE (?1 IS NULL OR id < ?1) ORDER BY id DESC LIMIT ?2
                """, arguments: [before, limit]).map { row in
                AuditEntry(id: row[0], at: row[1], actor: row[2], action: row[3], target: row[4], filter: row[5], count: row[6], detail: row[7])
            }
        }
    }
}
