import Foundation
import GRDB
import HistoryCore
import Messages
import ServiceKit

extension HistoryDatabase {
    /// Deletes one of the user's items for good: it leaves every read at once, and the purge of
    /// its job and files is queued for jobs in the same transaction. Nil for anyone else's item
    /// or an unknown id. An item this user deleted before is answered as the first delete was
    /// (while its tombstone is kept, `HISTORY_CHANGES_KEEP_S`): a delete whose answer was lost
    /// (a 503 that may have committed) can be sent again and learn that it happened.
    public func deleteItem(_ jobId: String, userId: String, now: Date) async throws -> DeletedHistoryItem? {
        try await write { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM item WHERE jobId = ? AND userId = ?", arguments: [jobId, userId]) else {
                let deletedBefore = try Int.fetchOne(db, sql: "SELECT 1 FROM deletion WHERE jobId = ? AND userId = ?", arguments: [jobId, userId])
                return deletedBefore == nil ? nil : DeletedHistoryItem(jobId: jobId)
            }
            try Self.removeItem(db, row: row, now: now)
            return DeletedHistoryItem(jobId: jobId)
        }
    }

    /// Of the next `limit` users after `afterUser` in id order, those who have an item created
    /// before `before`: the candidates of a retention sweep, found by one index probe per user
    /// (never a scan of every old item). `scannedThrough` is the last user looked at, nil when
    /// there are no more.
    public func usersWithItems(before: Date, afterUser: String, limit: Int) async throws -> (users: [String], scannedThrough: String?) {
        try await read { db in
            let scanned = try String.fetchAll(
                db, sql: "SELECT DISTINCT userId FROM item_count WHERE userId > ? ORDER BY userId LIMIT ?",
                arguments: [afterUser, limit]
            )
            let old = try db.cachedStatement(sql: "SELECT 1 FROM item WHERE userId = ? AND createdAt < ? LIMIT 1")
            let users = try scanned.filter { try Int.fetchOne(old, arguments: [$0, before.milliseconds]) != nil }
            return (users, scanned.last)
        }
    }

    /// Deletes, like `deleteItem`, up to `limit` of the user's ended items created before
    /// `cutoff`; queued and processing jobs are never touched. Returns how many went.
    public func deleteExpiredItems(userId: String, before cutoff: Date, limit: Int, now: Date) async throws -> Int {
        try await write { db in
            // The statuses retention may take are the rule's (`RetentionRule.sweepable`).
            let statuses = RetentionRule.sweepable.map(\.rawValue)
            var arguments: StatementArguments = [userId, cutoff.milliseconds]
            arguments += StatementArguments(statuses)
            arguments += [limit]
            let rows = try Row.fetchAll(
                db, sql: """
                    SELECT * FROM item WHERE userId = ? AND createdAt < ? AND status IN (\(databaseQuestionMarks(count: statuses.count)))
                    ORDER BY createdAt LIMIT ?
                    """,
                arguments: arguments
            )
            for row in rows { try Self.removeItem(db, row: row, now: now) }
            return rows.count
        }
    }

    /// Forgets tombstones deleted before `before` whose purge is done (the changes feed answers
    /// "too old" to tokens from before them), and expired share links. Returns the tombstones gone.
    public func pruneTombstones(before: Date, now: Date, limit: Int = 10_000) async throws -> Int {
        try await write { db in
            let rows = try Row.fetchAll(
                db, sql: """
                    SELECT jobId, changeSequence FROM deletion
                    WHERE deletedAt < ? AND jobId NOT IN (SELECT jobId FROM purge)
                    ORDER BY deletedAt LIMIT ?
                    """,
                arguments: [before.milliseconds, limit]
            )
            for row in rows {
                try db.execute(sql: "DELETE FROM deletion WHERE jobId = ?", arguments: [row["jobId"] as String])
            }
            if let highest = rows.map({ $0["changeSequence"] as Int64 }).max() {
                try db.execute(sql: "UPDATE meta SET value = max(value, ?) WHERE key = 'prunedThrough'", arguments: [highest])
            }
            try db.execute(sql: "DELETE FROM share WHERE expiresAt <= ?", arguments: [now.milliseconds])
            return rows.count
        }
    }

    /// Purges due at `now`, oldest first.
    public func duePurges(now: Date, limit: Int) async throws -> [OutboxItem<PendingPurge>] {
        try await read { db in
            try Row.fetchAll(
                db, sql: "SELECT jobId, userId, attempts FROM purge WHERE nextAttemptAt <= ? ORDER BY nextAttemptAt LIMIT ?",
                arguments: [now.milliseconds, limit]
            ).map { OutboxItem(id: $0["jobId"], kind: PendingPurge(jobId: $0["jobId"], userId: $0["userId"]), jobId: $0["jobId"], attempts: $0["attempts"]) }
        }
    }

    /// Jobs acknowledged the purges: they leave the outbox.
    public func purgesAcknowledged(_ jobIds: [String]) async throws {
        try await write { db in
            for jobId in jobIds { try db.execute(sql: "DELETE FROM purge WHERE jobId = ?", arguments: [jobId]) }
        }
    }

    /// The purge failed: try again at `retryAt`.
    public func purgesFailed(_ entries: [OutboxRetry]) async throws {
        try await write { db in
            let statement = try db.cachedStatement(sql: "UPDATE purge SET attempts = ?, nextAttemptAt = ? WHERE jobId = ?")
            for entry in entries { try statement.execute(arguments: [entry.attempts, entry.at.milliseconds, entry.id]) }
        }
    }

    /// Purges not yet acknowledged.
    public func pendingPurgeCount() async throws -> Int {
        try await read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM purge") ?? 0 }
    }
}
