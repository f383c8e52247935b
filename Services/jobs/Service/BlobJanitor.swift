import Blobs
import Foundation
import GRDB
import Logging
import Messages
import ServiceKit
import ServiceLifecycle

/// Deletes the files that purged jobs and refused results left behind, as recorded in the outbox
/// in the same transaction that orphaned them. Deleting a file that is already gone succeeds, so
/// an entry replayed after a crash does no harm.
public struct BlobJanitor: Service {
    let database: JobsDatabase
    let blobs: any BlobStore
    let interval: Duration
    let logger: Logger

    public init(database: JobsDatabase, blobs: any BlobStore, interval: Duration = .milliseconds(200), logger: Logger) {
        self.database = database
        self.blobs = blobs
        self.interval = interval
        self.logger = logger
    }

    public func run() async throws {
        await Periodic.run(every: interval, logger: logger, failure: "blob deletion failed") { try await deleteDue() }
    }

    /// Deletes the files of up to 100 entries; returns how many entries were done.
    @discardableResult
    public func deleteDue(now: Date = Date()) async throws -> Int {
        let due = try await database.writer.read { db in
            try OutboxEntry
                .filter(OutboxEntry.Columns.topic == OutboxEntry.Topic.blobs && OutboxEntry.Columns.nextAttemptAt <= now)
                .order(Column("id"))
                .limit(100)
                .fetchAll(db)
        }
        var done: [Int64] = []
        for entry in due {
            let keys = (try? JSONDecoder().decode([String].self, from: entry.payload ?? Data())) ?? []
            do {
                for key in keys where BlobKey.isValid(key) { try await blobs.delete(key) }
                if let id = entry.id { done.append(id) }
            } catch {
                logger.warning("cannot delete a job's files yet", metadata: ["job": "\(entry.jobId)", "error": "\(error)"])
                var retry = entry
                retry.attempts += 1
                retry.nextAttemptAt = now.addingTimeInterval(min(60, pow(2, Double(retry.attempts))))
                let later = retry
                try await database.writer.write { db in try later.update(db) }
            }
        }
        if !done.isEmpty {
            let finished = done
            try await database.writer.write { db in _ = try OutboxEntry.deleteAll(db, keys: finished) }
        }
        return done.count
    }
}
