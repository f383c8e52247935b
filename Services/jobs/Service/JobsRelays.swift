import Blobs
import Bus
import Foundation
import Logging
import Messages
import Metrics
import ServiceKit

/// The jobs service's four outboxes, each delivered by an `OutboxRelay` with the one retry policy
/// (`OutboxBackoff`): quota settlements, job events for history, files to delete, and push
/// notifications. Each takes
/// its topic of the store's outbox (`JobsOutbox` on SQLite, `PostgresJobsOutbox`).
public enum JobsRelays {
    /// `commit` for completed jobs, `release` for failed and cancelled ones; quota applies them
    /// idempotently by job id. A settlement quota has nothing to apply to (no reservation, or
    /// settled the other way already) is final too.
    public static func settlements<Box: Outbox<JobsOutboxKind>>(outbox: Box, quota: BusClient, logger: Logger) -> OutboxRelay<Box> {
        OutboxRelay("quota settlements", outbox: outbox, logger: logger, deliver: { items in
            await OutboxDeliveries.oneByOne(items) { item in
                guard case .settlement(let settlement) = item.kind else { return unreadable(item, logger) }
                do {
                    _ = try await quota.call(settlement == .commit ? Quota.commit : Quota.release, ChargeReference(jobId: item.jobId), timeout: .seconds(2))
                    return .delivered
                } catch let error as BusError where error.code == .notFound || error.code == Quota.ErrorCode.chargeSettled {
                    logger.warning("quota settlement not applicable", metadata: ["job": "\(item.jobId)", "kind": "\(settlement)", "error": "\(error)"])
                    return .delivered
                } catch {
                    return .retry
                }
            }
        })
    }

    /// Job events, in batches of up to 200 (and 512 KiB, well inside the bus's message limit),
    /// the longest due first; history applies each idempotently by (job id, version), so a batch
    /// sent twice changes nothing, and an older version after a newer one changes nothing.
    public static func historyEvents<Box: Outbox<JobsOutboxKind>>(outbox: Box, history: BusClient, logger: Logger) -> OutboxRelay<Box> {
        OutboxRelay(
            "job events for history", outbox: outbox, batchSize: 200,
            interval: .milliseconds(100), logger: logger,
            deliver: { items in
                var events: [JobEvent] = []
                var outcomes: [OutboxOutcome] = []
                var bytes = 0
                for item in items {
                    guard case .historyEvent(let event) = item.kind else {
                        outcomes.append(unreadable(item, logger))
                        continue
                    }
                    let size = event.approximateSize
                    if bytes + size > 512 * 1024, !events.isEmpty { break }
                    bytes += size
                    events.append(event)
                    outcomes.append(.delivered)
                }
                guard !events.isEmpty else { return outcomes }
                do {
                    // The delivery is linked to the trace of each job it carries.
                    try await BusTracing.withLinkedSpan("jobs.outbox.history", linking: events.map { $0.job.traceParent ?? "" }) {
                        _ = try await history.call(History.apply, JobEvents(events: events), timeout: .seconds(5))
                    }
                    return outcomes
                } catch {
                    return outcomes.map { _ in .retry }
                }
            }
        )
    }

    /// Files that purged jobs and refused results left behind. Deleting a file already gone
    /// succeeds, so an entry replayed after a crash does no harm.
    public static func fileDeletions<Box: Outbox<JobsOutboxKind>>(outbox: Box, blobs: any BlobStore, logger: Logger) -> OutboxRelay<Box> {
        OutboxRelay("file deletions", outbox: outbox, logger: logger) { items in
            await OutboxDeliveries.oneByOne(items) { item in
                guard case .fileDeletion(let keys) = item.kind else { return unreadable(item, logger) }
                do {
                    for key in keys where BlobKey.isValid(key) { try await blobs.delete(key) }
                    return .delivered
                } catch {
                    logger.debug("cannot delete a job's files yet", metadata: ["job": "\(item.jobId)", "error": "\(error)"])
                    return .retry
                }
            }
        }
    }

    /// A push notice is given up after this many tries (with the outbox's backoff, about eight
    /// minutes): news of a job that ended long ago is no longer worth a notification.
    public static let pushAttempts = 20

    /// Push notifications of ended jobs, one entry per device, sent at once (at most 20 a round,
    /// so a round fits well inside a PostgreSQL outbox lease). A token the push service no longer
    /// knows is forgotten; a notice refused for good is logged; one that cannot be sent now is
    /// tried again with the outbox's backoff, up to `pushAttempts` times. Counted in
    /// `jobs_push_total{platform, outcome}`.
    public static func notifications<Box: Outbox<JobsOutboxKind>>(outbox: Box, sender: PushSender, store: any JobsStore, logger: Logger) -> OutboxRelay<Box> {
        OutboxRelay("push notifications", outbox: outbox, batchSize: 20, logger: logger) { items in
            await withTaskGroup(of: (Int, OutboxOutcome).self) { group in
                for (index, item) in items.enumerated() {
                    group.addTask {
                        guard case .push(let notice) = item.kind else { return (index, unreadable(item, logger)) }
                        func counted(_ outcome: String) {
                            Counter(label: "jobs_push_total", dimensions: [("platform", notice.platform.rawValue), ("outcome", outcome)]).increment()
                        }
                        switch await sender.send(notice) {
                        case .delivered:
                            counted("delivered")
                            return (index, .delivered)
                        case .unregistered:
                            do {
                                try await store.forgetDevice(token: notice.token)
                            } catch {
                                return (index, .retry)
                            }
                            counted("unregistered")
                            logger.debug("push token unregistered; device forgotten", metadata: ["platform": "\(notice.platform.rawValue)"])
                            return (index, .delivered)
                        case .rejected(let reason):
                            counted("rejected")
                            logger.warning("push notification refused", metadata: ["job": "\(notice.jobId)", "reason": "\(reason)"])
                            return (index, .delivered)
                        case .retry:
                            guard item.attempts + 1 < pushAttempts else {
                                counted("expired")
                                logger.warning("push notification given up", metadata: ["job": "\(notice.jobId)", "attempts": "\(item.attempts + 1)"])
                                return (index, .delivered)
                            }
                            counted("retried")
                            return (index, .retry)
                        }
                    }
                }
                var outcomes = [OutboxOutcome](repeating: .retry, count: items.count)
                for await (index, outcome) in group { outcomes[index] = outcome }
                return outcomes
            }
        }
    }

    static func unreadable(_ item: OutboxItem<JobsOutboxKind>, _ logger: Logger) -> OutboxOutcome {
        logger.error("dropped an unreadable outbox entry", metadata: ["job": "\(item.jobId)", "entry": "\(item.kind)"])
        return .delivered
    }
}

extension JobEvent {
    /// An upper bound of the event's size on the bus: its strings' bytes plus a fixed allowance
    /// for the numbers, dates and field tags.
    var approximateSize: Int {
        let job = self.job
        let submission = job.submission
        let strings = [job.id, job.userId, job.imageKey, job.effectId, effectTitle, job.prompt ?? "", job.lastError ?? "",
                       job.resultKey ?? "", job.thumbnailKey ?? "", job.traceParent ?? "", submission?.provider ?? "",
                       submission?.requestId ?? "", submission?.statusURL ?? "", submission?.responseURL ?? "", submission?.cancelURL ?? ""]
        return strings.reduce(512) { $0 + $1.utf8.count } + job.parameters.reduce(0) { $0 + $1.key.utf8.count + 16 }
    }
}
