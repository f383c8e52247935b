import Foundation
import GRDB
import JobsCore
import Messages
import ServiceKit
import Storage

/// The jobs service's outbox entries, by receiver: written by `SQLiteJobsStore` in the transaction of the
/// change that caused them (history's: the changed row itself), delivered by an `OutboxRelay` each
/// (`JobsRelays`).
public enum JobsOutboxKind: Sendable, Equatable {
    /// A quota settlement of an ended job.
    case settlement(JobRules.Settlement)
    /// A job's current version, for history (read from its row by `JobsHistoryFeed`).
    case historyEvent(JobEvent)
    /// Files to delete from the blob store.
    case fileDeletion([String])
    /// A push notification of an ended job, for one device.
    case push(PushNotice)
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
        try await database.read { [topic] db in
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
        try await database.write { db in _ = try OutboxEntry.deleteAll(db, keys: keys) }
    }

    public func retry(_ entries: [OutboxRetry]) async throws {
        try await database.write { db in
            let statement = try db.cachedStatement(sql: "UPDATE outbox SET attempts = ?, nextAttemptAt = ? WHERE id = ?")
            for entry in entries { try statement.execute(arguments: [entry.attempts, StoredDate.text(entry.at), entry.id]) }
        }
    }

    static func kind(topic: String, kind: String, payload: Data?) -> JobsOutboxKind {
        switch topic {
        case OutboxEntry.Topic.quota:
            return JobRules.Settlement(rawValue: kind).map(JobsOutboxKind.settlement) ?? .unreadable("settlement \(kind)")
        case OutboxEntry.Topic.blobs:
            guard let payload, let keys = try? JSONDecoder().decode([String].self, from: payload) else { return .unreadable("file list") }
            return .fileDeletion(keys)
        case OutboxEntry.Topic.push:
            guard let payload, let notice = try? JSONDecoder().decode(PushNotice.self, from: payload) else { return .unreadable("push notice") }
            return .push(notice)
        default:
            return .unreadable("topic \(topic)")
        }
    }
}

/// History's events, read from the job rows: a state change marks its row due (`historyDueAt`)
/// in its own transaction, and this hands the relay each due job's *current* version. So a change
/// writes no event of its own, and the changes a job goes through between two deliveries reach
/// history as one event (history keeps a job's latest version; it needs no step between).
/// Acknowledging a version clears the mark only if the row still has that version: a change made
/// during the delivery stays due.
public struct JobsHistoryFeed: Outbox {
    let database: JobsDatabase
    /// Effect ids to the titles the app shows, carried in the events.
    let effectTitles: [String: String]

    public init(store: SQLiteJobsStore) {
        self.database = store.database
        self.effectTitles = store.effectTitles
    }

    public func due(now: Date, limit: Int) async throws -> [OutboxItem<JobsOutboxKind>] {
        try await database.read { [effectTitles] db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(sql: """
                    SELECT \(JobRows.columns), historyAttempts FROM job WHERE historyDueAt IS NOT NULL AND historyDueAt <= ? ORDER BY historyDueAt LIMIT ?
                    """),
                arguments: [StoredDate.text(now), limit]
            )
            var items: [OutboxItem<JobsOutboxKind>] = []
            while let row = try rows.next() {
                let id: String = row[0]
                guard let job = try? JobRows.job(row) else {
                    items.append(HistoryFeedItem.unreadable(jobId: id, version: row[18], attempts: row[JobRows.columnCount]))
                    continue
                }
                items.append(HistoryFeedItem.item(job, effectTitles: effectTitles, attempts: row[JobRows.columnCount]))
            }
            return items
        }
    }

    public func acknowledge(_ ids: [String]) async throws {
        let versions = ids.compactMap(HistoryFeedItem.parse)
        guard !versions.isEmpty else { return }
        try await database.write { db in
            let statement = try db.cachedStatement(sql: "UPDATE job SET historyDueAt = NULL, historyAttempts = 0 WHERE id = ? AND version = ?")
            for (jobId, version) in versions { try statement.execute(arguments: [jobId, version]) }
        }
    }

    public func retry(_ entries: [OutboxRetry]) async throws {
        try await database.write { db in
            let statement = try db.cachedStatement(sql: "UPDATE job SET historyAttempts = ?, historyDueAt = ? WHERE id = ? AND version = ?")
            for entry in entries {
                guard let (jobId, version) = HistoryFeedItem.parse(entry.id) else { continue }
                try statement.execute(arguments: [entry.attempts, StoredDate.text(entry.at), jobId, version])
            }
        }
    }
}

/// A job version as an item of history's feed, on either store: its id is `version:jobId`.
enum HistoryFeedItem {
    static func id(jobId: String, version: Int) -> String { "\(version):\(jobId)" }

    static func parse(_ id: String) -> (jobId: String, version: Int)? {
        guard let colon = id.firstIndex(of: ":"), let version = Int(id[..<colon]) else { return nil }
        return (String(id[id.index(after: colon)...]), version)
    }

    /// A due row this version cannot read: logged and acknowledged by the relay.
    static func unreadable(jobId: String, version: Int, attempts: Int) -> OutboxItem<JobsOutboxKind> {
        OutboxItem(id: id(jobId: jobId, version: version), kind: .unreadable("job row"), jobId: jobId, attempts: attempts)
    }

    static func item(_ job: JobRecord, effectTitles: [String: String], attempts: Int) -> OutboxItem<JobsOutboxKind> {
        OutboxItem(
            id: id(jobId: job.id, version: job.version),
            kind: .historyEvent(JobEvent(job: job, effectTitle: effectTitles[job.effectId] ?? job.effectId)),
            jobId: job.id, attempts: attempts
        )
    }
}
