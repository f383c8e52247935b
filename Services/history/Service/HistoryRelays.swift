import Bus
import Foundation
import Logging
import Messages
import ServiceKit

/// History's outbox, delivered by an `OutboxRelay`: jobs is asked to purge the jobs of deleted
/// items until it acknowledges each, so a delete made while jobs is down completes by itself once
/// it is back. Woken at once by a delete (`wake()`); otherwise it looks for due retries every
/// `interval`.
public enum HistoryRelays {
    public static func purges(store: any HistoryStore, jobs: BusClient, interval: Duration = .seconds(1), logger: Logger) -> OutboxRelay<PurgeOutbox> {
        OutboxRelay("purges for jobs", outbox: store.purges, batchSize: 50, interval: interval, logger: logger, deliver: { items in
            await OutboxDeliveries.oneByOne(items) { item in
                do {
                    _ = try await jobs.call(Jobs.purge, JobReference(jobId: item.kind.jobId, userId: item.kind.userId), timeout: .seconds(2))
                    return .delivered
                } catch {
                    logger.debug("purge failed", metadata: ["job": "\(item.jobId)", "error": "\(error)"])
                    return .retry
                }
            }
        })
    }
}
