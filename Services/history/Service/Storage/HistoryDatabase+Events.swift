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
            var batch = EventBatch()
            var applied = 0
            for event in events where try Self.apply(db, event, in: &batch) { applied += 1 }
            try batch.finish(db)
            return applied
        }
    }

    /// What a batch of events changes besides the items themselves, gathered and written once at
    /// its end instead of at each event: the numbers it takes (changes feed, item ids) and the
    /// counts per user and status. Per event these were four of its statements.
    struct EventBatch {
        /// The last change number and item id taken; nil until the batch first needs one.
        private var changeSequence: Int64?
        private var itemId: Int64?
        /// Each (user, status) count's change.
        private var counts: [CountKey: Int] = [:]

        struct CountKey: Hashable {
            var userId: String
            var status: String
        }

        /// The next number of the changes feed.
        mutating func nextChangeSequence(_ db: Database) throws -> Int64 {
            let next = try (changeSequence ?? Self.meta(db, "changeSequence")) + 1
            changeSequence = next
            return next
        }

        /// The id of a new item (its row in the search index).
        mutating func nextItemId(_ db: Database) throws -> Int64 {
            let next = try (itemId ?? Self.meta(db, "itemId")) + 1
            itemId = next
            return next
        }

        mutating func count(userId: String, status: String, by delta: Int) {
            counts[CountKey(userId: userId, status: status), default: 0] += delta
        }

        /// Writes the numbers taken and the counts' changes.
        func finish(_ db: Database) throws {
            if let changeSequence { try Self.setMeta(db, "changeSequence", changeSequence) }
            if let itemId { try Self.setMeta(db, "itemId", itemId) }
            for (key, delta) in counts where delta != 0 {
                try HistoryDatabase.adjustCount(db, userId: key.userId, status: key.status, by: delta)
            }
        }

        private static func meta(_ db: Database, _ key: String) throws -> Int64 {
            try Int64.fetchOne(db.cachedStatement(sql: "SELECT value FROM meta WHERE key = ?"), arguments: [key]) ?? 0
        }

        private static func setMeta(_ db: Database, _ key: String, _ value: Int64) throws {
            try db.cachedStatement(sql: "UPDATE meta SET value = ? WHERE key = ?").execute(arguments: [value, key])
        }
    }

    /// An event's update of its item: every column but the primary key's (user, creation), and
    /// with them, for an item that moves.
    private static let updatedColumns = """
        effectId = ?, effectTitle = ?, prompt = ?, status = ?, progress = ?, updatedAt = ?, finishedAt = ?, resultKey = ?,
        thumbnailKey = ?, imageKey = ?, parameters = ?, cost = ?, lastError = ?, version = ?, changeSequence = ?
        """
    private static let updateInPlace = "UPDATE item SET \(updatedColumns) WHERE jobId = ?"
    private static let updateAndMove = "UPDATE item SET userId = ?, createdAt = ?, \(updatedColumns) WHERE jobId = ?"

    static func apply(_ db: Database, _ event: JobEvent, in batch: inout EventBatch) throws -> Bool {
        let job = event.job
        let createdAt = job.createdAt.milliseconds
        if let deletedCreatedAt = try Int64.fetchOne(db.cachedStatement(sql: "SELECT createdAt FROM deletion WHERE jobId = ?"), arguments: [job.id]) {
            guard deletedCreatedAt != createdAt else { return false }
            try db.cachedStatement(sql: "DELETE FROM deletion WHERE jobId = ?").execute(arguments: [job.id])
        }
        let existing = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT version, status, userId, createdAt, id, prompt, effectTitle FROM item WHERE jobId = ?"), arguments: [job.id]
        )
        if let existing, (existing["version"] as Int) >= job.version { return false }
        let cost = HistoryReads.cost(of: job)
        let parameters = HistoryReads.json(job.parameters)
        let sequence = try batch.nextChangeSequence(db)
        // The columns every event sets; the primary key's (user, creation) apart.
        let values: [(any DatabaseValueConvertible)?] = [
            job.effectId, event.effectTitle, job.prompt, job.status.rawValue, job.progress, job.updatedAt.milliseconds,
            job.finishedAt?.milliseconds, job.resultKey, job.thumbnailKey, job.imageKey, parameters, cost, job.lastError, job.version, sequence,
        ]
        if let existing {
            // The search entry moves only when its text changed (a job's prompt and title are
            // set at its creation: in practice never).
            let id: Int64 = existing["id"], oldPrompt: String? = existing["prompt"], oldTitle: String = existing["effectTitle"]
            let reindex = oldPrompt != job.prompt || oldTitle != event.effectTitle
            if reindex { try SearchIndex.remove(db, id: id) }
            if (existing["userId"] as String) == job.userId, (existing["createdAt"] as Int64) == createdAt {
                // The item stays where it is. Naming the primary key's columns in the SET, even
                // with their values unchanged, makes SQLite delete the row and insert it again,
                // with an entry in each of its five indexes (`history-bench events`: 35,200 →
                // 39,700 updates a second without them).
                try db.cachedStatement(sql: Self.updateInPlace).execute(arguments: StatementArguments(values + [job.id]))
            } else {
                // Another user or creation time under the same job id: the item moves.
                try db.cachedStatement(sql: Self.updateAndMove).execute(arguments: StatementArguments([job.userId, createdAt] + values + [job.id]))
            }
            batch.count(userId: existing["userId"], status: existing["status"], by: -1)
            if reindex { try SearchIndex.add(db, id: id, prompt: job.prompt, effectTitle: event.effectTitle) }
        } else {
            let id = try batch.nextItemId(db)
            try db.cachedStatement(
                sql: """
                    INSERT INTO item (userId, createdAt, effectId, effectTitle, prompt, status, progress, updatedAt, finishedAt,
                        resultKey, thumbnailKey, imageKey, parameters, cost, lastError, version, changeSequence, jobId, id)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """
            ).execute(arguments: StatementArguments([job.userId, createdAt] + values + [job.id, id]))
            try SearchIndex.add(db, id: id, prompt: job.prompt, effectTitle: event.effectTitle)
        }
        batch.count(userId: job.userId, status: job.status.rawValue, by: 1)
        return true
    }
}
