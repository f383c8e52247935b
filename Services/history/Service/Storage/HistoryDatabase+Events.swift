import Foundation
import GRDB
import Messages

extension HistoryDatabase {
    /// Applies job events in one transaction: an item is inserted or moved forward to the event's
    /// version; a replayed or older version changes nothing, and a deleted job stays deleted (a
    /// job created again under the same id, with another creation time, starts a new item).
    /// Returns how many events changed an item.
    public func applyJobEvents(_ events: [JobEvent]) async throws -> Int {
        try await write { db in
            var applied = 0
            for event in events where try Self.apply(db, event) { applied += 1 }
            return applied
        }
    }

    static func apply(_ db: Database, _ event: JobEvent) throws -> Bool {
        let job = event.job
        let createdAt = job.createdAt.milliseconds
        if let deletedCreatedAt = try Int64.fetchOne(db.cachedStatement(sql: "SELECT createdAt FROM deletion WHERE jobId = ?"), arguments: [job.id]) {
            guard deletedCreatedAt != createdAt else { return false }
            try db.cachedStatement(sql: "DELETE FROM deletion WHERE jobId = ?").execute(arguments: [job.id])
        }
        let existing = try Row.fetchOne(db.cachedStatement(sql: "SELECT version, status, userId FROM item WHERE jobId = ?"), arguments: [job.id])
        if let existing, (existing["version"] as Int) >= job.version { return false }
        let cost = HistoryReads.cost(of: job)
        let parameters = try HistoryReads.json(job.parameters)
        let sequence = try nextChangeSequence(db)
        let values: [(any DatabaseValueConvertible)?] = [
            job.userId, job.effectId, event.effectTitle, job.prompt, job.status.rawValue, job.progress, createdAt,
            job.updatedAt.milliseconds, job.finishedAt?.milliseconds, job.resultKey, job.thumbnailKey, job.imageKey,
            parameters, cost, job.lastError, job.version, sequence,
        ]
        if let existing {
            try db.cachedStatement(
                sql: """
                    UPDATE item SET userId = ?, effectId = ?, effectTitle = ?, prompt = ?, status = ?, progress = ?, createdAt = ?,
                        updatedAt = ?, finishedAt = ?, resultKey = ?, thumbnailKey = ?, imageKey = ?, parameters = ?, cost = ?,
                        lastError = ?, version = ?, changeSequence = ?
                    WHERE jobId = ?
                    """
            ).execute(arguments: StatementArguments(values + [job.id]))
            try adjustCount(db, userId: existing["userId"], status: existing["status"], by: -1)
        } else {
            try db.cachedStatement(
                sql: """
                    INSERT INTO item (userId, effectId, effectTitle, prompt, status, progress, createdAt, updatedAt, finishedAt,
                        resultKey, thumbnailKey, imageKey, parameters, cost, lastError, version, changeSequence, jobId, id)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """
            ).execute(arguments: StatementArguments(values + [job.id, try nextItemId(db)]))
        }
        try adjustCount(db, userId: job.userId, status: job.status.rawValue, by: 1)
        return true
    }
}
