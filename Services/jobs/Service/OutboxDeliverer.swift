import Bus
import Foundation
import GRDB
import Logging
import Messages
import ServiceKit
import ServiceLifecycle

/// Delivers the outbox's quota settlements: `commit` for completed jobs, `release` for failed and
/// cancelled ones, with acknowledgements and retries (backing off to a minute). Quota applies
/// them idempotently by job id. History events stay in the outbox until a history consumer
/// acknowledges them.
public struct OutboxDeliverer: Service {
    let database: JobsDatabase
    let quota: BusClient
    let interval: Duration
    let logger: Logger

    public init(database: JobsDatabase, quota: BusClient, interval: Duration = .milliseconds(200), logger: Logger) {
        self.database = database
        self.quota = quota
        self.interval = interval
        self.logger = logger
    }

    public func run() async throws {
        // Undelivered entries stay in the outbox across a shutdown.
        await Periodic.run(every: interval, logger: logger, failure: "outbox delivery failed") { try await deliverDue() }
        await quota.shutdown()
    }

    /// Sends every due quota settlement once; returns how many were acknowledged.
    @discardableResult
    public func deliverDue(now: Date = Date()) async throws -> Int {
        let due = try await database.writer.read { db in
            try OutboxEntry
                .filter(OutboxEntry.Columns.topic == OutboxEntry.Topic.quota && OutboxEntry.Columns.nextAttemptAt <= now)
                .order(Column("id"))
                .limit(100)
                .fetchAll(db)
        }
        var acknowledged = 0
        for var entry in due {
            let reference = ChargeReference(jobId: entry.jobId)
            var done: Bool
            do {
                _ = try await quota.call(entry.kind == "commit" ? Quota.commit : Quota.release, reference, timeout: .seconds(2))
                done = true
            } catch where error.code == .notFound || error.code == Quota.ErrorCode.chargeSettled {
                // No reservation to settle, or settled the other way already: nothing to retry.
                logger.warning("quota settlement not applicable", metadata: ["job": "\(entry.jobId)", "kind": "\(entry.kind)", "error": "\(error)"])
                done = true
            } catch {
                done = false
                entry.attempts += 1
                entry.nextAttemptAt = now.addingTimeInterval(min(60, pow(2, Double(entry.attempts - 1))))
            }
            let settled = entry, delivered = done
            try await database.writer.write { db in
                if delivered { _ = try settled.delete(db) } else { try settled.update(db) }
            }
            if done { acknowledged += 1 }
        }
        return acknowledged
    }
}
