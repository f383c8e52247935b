import Bus
import Foundation
import GRDB
import Logging
import Messages
import ServiceLifecycle

/// Delivers the outbox's job events to history in batches, oldest first, with acknowledgements:
/// an entry leaves the outbox only once history has answered that its batch is durable. History
/// applies each event idempotently by (job id, version), so a batch sent twice changes nothing.
/// While history does not answer, the deliverer backs off (doubling to `maxBackoff`) and logs the
/// outage once, not per retry.
public struct HistoryEventDeliverer: Service {
    let database: JobsDatabase
    let history: BusClient
    let interval: Duration
    let maxBackoff: Duration
    let batchSize: Int
    let logger: Logger

    public init(database: JobsDatabase, history: BusClient, interval: Duration = .milliseconds(100), maxBackoff: Duration = .seconds(5), batchSize: Int = 200, logger: Logger) {
        self.database = database
        self.history = history
        self.interval = interval
        self.maxBackoff = maxBackoff
        self.batchSize = max(1, batchSize)
        self.logger = logger
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            var failures = 0
            while !Task.isCancelled {
                var wait = interval
                do {
                    let delivered = try await deliverBatch()
                    if failures > 0 { logger.info("history reachable again: delivering job events") }
                    failures = 0
                    if delivered == batchSize { continue }
                } catch {
                    if failures == 0 { logger.warning("history does not take job events; retrying with backoff", metadata: ["error": "\(error)"]) }
                    failures += 1
                    wait = min(maxBackoff, interval * (1 << min(failures, 10)))
                }
                try await Task.sleep(for: wait)
            }
        }
        await history.shutdown()
    }

    /// Sends the oldest batch of job events; returns how many entries left the outbox.
    @discardableResult
    public func deliverBatch() async throws -> Int {
        let entries = try await database.writer.read { [batchSize] db in
            try OutboxEntry
                .filter(OutboxEntry.Columns.topic == OutboxEntry.Topic.history)
                .order(Column("id"))
                .limit(batchSize)
                .fetchAll(db)
        }
        guard !entries.isEmpty else { return 0 }
        var events: [JobEvent] = []
        var bytes = 0
        var sent: [Int64] = []
        for entry in entries {
            let payload = entry.payload ?? Data()
            // Stay well inside the bus's message limit (1 MiB).
            if bytes + payload.count > 512 * 1024, !events.isEmpty { break }
            bytes += payload.count
            if let id = entry.id { sent.append(id) }
            if let event = try? JobRows.event(payload) {
                events.append(event)
            } else {
                logger.error("dropped an undecodable history event", metadata: ["job": "\(entry.jobId)", "version": "\(entry.version)"])
            }
        }
        if !events.isEmpty {
            _ = try await history.call(History.apply, JobEvents(events: events), timeout: .seconds(5))
        }
        let acknowledged = sent
        try await database.writer.write { db in
            _ = try OutboxEntry.deleteAll(db, keys: acknowledged)
        }
        return sent.count
    }
}
