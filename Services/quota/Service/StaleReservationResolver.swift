import Bus
import Foundation
import Logging
import Messages
import ServiceKit
import ServiceLifecycle

/// Settles reservations nobody confirmed (the gateway died between reserve and create, say): a
/// reservation older than `staleAfter` is looked up in the jobs service. No such job: released,
/// and jobs records the id as abandoned in the same step, so a creation still on its way (a lost
/// request retried late) fails rather than running on units given back.
/// A completed job: committed; a failed or cancelled one: released. A job still queued or
/// processing is left alone: its own settlement arrives through the jobs outbox. A reservation
/// made well after its job ended is not that job's charge: it is a forgotten job id sent again
/// (an `Idempotency-Key` past its window), which the gateway refused but could not give back:
/// released.
public struct StaleReservationResolver: Service {
    let store: any QuotaStore
    let jobs: BusClient
    let staleAfter: Duration
    let interval: Duration
    let logger: Logger

    public init(store: any QuotaStore, jobs: BusClient, staleAfter: Duration, interval: Duration, logger: Logger) {
        self.store = store
        self.jobs = jobs
        self.staleAfter = staleAfter
        self.interval = interval
        self.logger = logger
    }

    /// How far the clocks of jobs and quota may disagree: a reservation this much after its job
    /// ended is not the job's.
    static let clockSkew: TimeInterval = 60

    public func run() async throws {
        await Periodic.run(every: interval, logger: logger, failure: "stale reservation scan failed") {
            try await resolve(now: Date())
        }
    }

    /// One scan: returns how many reservations were settled.
    @discardableResult
    public func resolve(now: Date) async throws -> Int {
        let cutoff = now.addingTimeInterval(-Double(staleAfter.components.seconds) - Double(staleAfter.components.attoseconds) / 1e18)
        let stale = try await store.staleReservations(before: cutoff, limit: 100)
        var settled = 0
        for reservation in stale {
            let jobId = reservation.jobId
            let existence: JobExistence
            do {
                existence = try await jobs.call(Jobs.lookup, JobLookup(jobId: jobId, abandonIfAbsent: true), timeout: .seconds(2))
            } catch {
                logger.warning("jobs did not answer about a stale reservation", metadata: ["job": "\(jobId)", "error": "\(error)"])
                return settled
            }
            let action: String?
            switch existence.status {
            case nil: action = "release"
            case .completed? where existence.finishedAt.map { $0 < reservation.reservedAt - Self.clockSkew } ?? false: action = "release"
            case .completed?: action = "commit"
            case .failed?, .cancelled?: action = "release"
            case .queued?, .processing?: action = nil
            }
            guard let action else { continue }
            _ = action == "commit" ? try await store.commit(jobId: jobId, now: now) : try await store.release(jobId: jobId, now: now)
            settled += 1
            logger.info("stale reservation settled", metadata: ["job": "\(jobId)", "action": "\(action)", "job-exists": "\(existence.exists)"])
        }
        return settled
    }
}
