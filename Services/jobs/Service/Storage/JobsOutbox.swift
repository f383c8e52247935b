import Foundation
import GRDB
import JobsCore
import ServiceKit
import Storage

/// The jobs service's outbox entries, by receiver: written by `SQLiteJobsStore` in the transaction of the
/// change that caused them, delivered by an `OutboxRelay` each (`JobsRelays`).
public enum JobsOutboxKind: Sendable, Equatable {
    /// A quota settlement of an ended job.
    case settlement(JobRules.Settlement)
    /// A job event for history (its encoded `JobEvent`).
    case historyEvent(Data)
    /// Files to delete from the blob store.
    case fileDeletion([String])
    /// A row this version cannot read (its kind or payload): logged and acknowledged.
    case unreadable(String)
}

/// One topic of the jobs database's outbox table, as a relay reads it.
public struct JobsOutbox: Outbox {
    let database: JobsDatabase
    let topic: String

    public init(database: JobsDatabase, topic: String) {
        self.database = database
        self.topic = topic
    }

    public func due(now: Date, limit: Int) async throws -> [OutboxItem<JobsOutboxKind>] {
        try await database.writer.read { [topic] db in
            try Row.fetchAll(
                db.cachedStatement(sql: """
                    SELECT id, kind, jobId, attempts, payload FROM outbox WHERE topic = ? AND nextAttemptAt <= ? ORDER BY nextAttemptAt, id LIMIT ?
                    """),
                arguments: [topic, StoredDate.text(now), limit]
            ).map { row in
                OutboxItem(id: String(row["id"] as Int64), kind: Self.kind(topic: topic, kind: row["kind"], payload: row["payload"]), jobId: row["jobId"], attempts: row["attempts"])
            }
        }
    }

    public func acknowledge(_ ids: [String]) async throws {
        let keys = ids.compactMap { Int64($0) }
        try await database.writer.write { db in _ = try OutboxEntry.deleteAll(db, keys: keys) }
    }

    public func retry(_ id: String, attempts: Int, at: Date) async throws {
        try await database.writer.write { db in
            try db.execute(sql: "UPDATE outbox SET attempts = ?, nextAttemptAt = ? WHERE id = ?", arguments: [attempts, StoredDate.text(at), id])
        }
    }

    static func kind(topic: String, kind: String, payload: Data?) -> JobsOutboxKind {
        switch topic {
        case OutboxEntry.Topic.quota:
            return JobRules.Settlement(rawValue: kind).map(JobsOutboxKind.settlement) ?? .unreadable("settlement \(kind)")
        case OutboxEntry.Topic.history:
            return payload.map(JobsOutboxKind.historyEvent) ?? .unreadable("history event without a body")
        case OutboxEntry.Topic.blobs:
            guard let payload, let keys = try? JSONDecoder().decode([String].self, from: payload) else { return .unreadable("file list") }
            return .fileDeletion(keys)
        default:
            return .unreadable("topic \(topic)")
        }
    }
}
