import Bus
import Foundation
import HistoryCore
import Logging
import Messages
import ServiceKit
import ServiceLifecycle

/// Deletes, every `interval`, each user's items older than their current plan keeps them (asked
/// of quota at each sweep, so a plan change applies from the next one), in bounded batches and the
/// same way as a user's delete. Also forgets tombstones older than the changes feed keeps.
public struct RetentionSweeper: Service {
    let database: any HistoryStore
    let quota: BusClient
    let interval: Duration
    let changesKeep: Duration
    let purges: any OutboxWaker
    let logger: Logger
    let now: @Sendable () -> Date

    /// Users looked at per batch, items deleted per user per batch, and items deleted per sweep.
    let usersPerBatch = 500
    let itemsPerBatch = 500
    let itemsPerSweep = 50_000

    public init(
        store: any HistoryStore, quota: BusClient, interval: Duration, changesKeep: Duration, purges: any OutboxWaker,
        logger: Logger, now: @escaping @Sendable () -> Date = Date.init
    ) {
        self.database = store
        self.quota = quota
        self.interval = interval
        self.changesKeep = changesKeep
        self.purges = purges
        self.logger = logger
        self.now = now
    }

    public func run() async throws {
        await Periodic.run(every: interval, logger: logger, failure: "retention sweep stopped early; it runs again next time") {
            let deleted = try await sweep()
            if deleted > 0 { logger.info("retention sweep done", metadata: ["deleted": "\(deleted)"]) }
        }
    }

    /// One sweep; returns how many items it deleted.
    @discardableResult
    public func sweep() async throws -> Int {
        let started = now()
        let seconds = Double(changesKeep.components.seconds)
        _ = try await database.pruneTombstones(before: started.addingTimeInterval(-seconds), now: started, limit: 10_000)
        let plans = try await quota.call(Quota.plans, Empty(), timeout: .seconds(2))
        guard let shortest = plans.map(\.retentionDays).min() else { return 0 }
        var deleted = 0
        var afterUser = ""
        while deleted < itemsPerSweep {
            let (users, scannedThrough) = try await database.usersWithItems(
                before: RetentionRule.cutoff(now: started, retentionDays: shortest), afterUser: afterUser, limit: usersPerBatch
            )
            guard let scannedThrough else { break }
            afterUser = scannedThrough
            for user in users {
                let status = try await quota.call(Quota.status, UserReference(userId: user), timeout: .seconds(2))
                let cutoff = RetentionRule.cutoff(now: started, retentionDays: status.retentionDays)
                while deleted < itemsPerSweep {
                    let batch = try await database.deleteExpiredItems(userId: user, before: cutoff, limit: itemsPerBatch, now: now())
                    deleted += batch
                    if batch < itemsPerBatch { break }
                }
            }
            purges.wake()
        }
        return deleted
    }
}
