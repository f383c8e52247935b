import Bus
import Foundation
import Logging
import Messages
import ServiceLifecycle

/// Asks jobs to purge the jobs of deleted items, from history's own outbox, until jobs
/// acknowledges each: a delete made while jobs is down completes by itself once it is back.
/// Woken at once by a delete; otherwise it looks for due retries every `interval`.
public final class PurgeDeliverer: Service, Sendable {
    let database: HistoryDatabase
    let jobs: BusClient
    let interval: Duration
    let logger: Logger
    private let signals: AsyncStream<Void>
    private let signal: AsyncStream<Void>.Continuation

    public init(database: HistoryDatabase, jobs: BusClient, interval: Duration = .seconds(1), logger: Logger) {
        self.database = database
        self.jobs = jobs
        self.interval = interval
        self.logger = logger
        (signals, signal) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Delivers due purges now rather than at the next interval.
    public func wake() { signal.yield() }

    public func run() async throws {
        await cancelWhenGracefulShutdown { [self, signal, interval] in
            await withTaskGroup(of: Void.self) { group in
                // The interval's wake-up, beside `wake()`'s
                group.addTask {
                    while !Task.isCancelled {
                        try? await Task.sleep(for: interval)
                        signal.yield()
                    }
                }
                group.addTask { [self] in
                    var failing = false
                    for await _ in signals {
                        guard !Task.isCancelled else { break }
                        do {
                            let failed = try await deliverDue()
                            if failed > 0, !failing { logger.warning("jobs does not take purges yet; they stay queued and are retried") }
                            if failed == 0, failing { logger.info("jobs takes purges again") }
                            failing = failed > 0
                        } catch is CancellationError {
                            break
                        } catch {
                            logger.error("purge delivery failed", metadata: ["error": "\(error)"])
                        }
                    }
                }
                await group.next()
                group.cancelAll()
            }
        }
        signal.finish()
        await jobs.shutdown()
    }

    /// Sends the due purges, oldest first, until none is left or one fails: that one is put back
    /// with a backoff, and the rest wait for the next round rather than each waiting out a
    /// timeout while jobs is down. Returns how many failed (0 or 1).
    @discardableResult
    public func deliverDue(now: Date = Date()) async throws -> Int {
        while true {
            let due = try await database.duePurges(now: now, limit: 50)
            if due.isEmpty { return 0 }
            for purge in due {
                do {
                    _ = try await jobs.call(Jobs.purge, JobReference(jobId: purge.jobId, userId: purge.userId), timeout: .seconds(2))
                    try await database.purgeAcknowledged(purge.jobId)
                } catch {
                    let delay = min(60, pow(2, Double(purge.attempts)))
                    try await database.purgeFailed(purge.jobId, retryAt: now.addingTimeInterval(delay))
                    logger.debug("purge failed", metadata: ["job": "\(purge.jobId)", "error": "\(error)"])
                    return 1
                }
            }
        }
    }
}
