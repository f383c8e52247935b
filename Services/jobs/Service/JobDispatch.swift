import Bus
import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import Storage
import Synchronization

/// What the jobs service's bus methods need of dispatching: to hand it a created job, tell it of
/// a cancel or a provider's webhook, and read the progress it knows. One process's `Dispatcher`
/// (SQLite, one jobs process), or `ReplicatedDispatch` (PostgreSQL, replicas with one elected
/// dispatcher).
public protocol JobDispatch: Sendable {
    /// Jobs waiting for a worker (what `create` compares with `JOBS_MAX_QUEUED`).
    var queuedCount: Int { get async }
    func enqueue(_ job: JobRecord) async
    func cancel(_ job: JobRecord) async
    func poke(jobId: String) async
    /// The job with the progress to show for it.
    func withLiveProgress(_ job: JobRecord) async -> JobRecord
    func withLiveProgress(_ jobs: [JobRecord]) async -> [JobRecord]
    /// Progress known beyond the stored one, by job.
    func liveProgress(of ids: [String]) async -> [String: Double]
    /// Operators changed the controls (stored already): put them in force.
    func apply(_ controls: DispatchControls) async
    /// The dispatcher's live state; nil on a replica that does not dispatch.
    func live() async -> LiveDispatch?
}

/// What operators read of the dispatcher live.
public struct LiveDispatch: Sendable {
    public var workers: [DispatchStateMachine<BusChannel.Peer>.WorkerView]
    public var activeByProvider: [String: Int]
    public var providerLimits: [String: Int]
    public var controls: DispatchControls
    public var lastHour: [RecentOutcomes.Minute]
    /// The metrics text each connected worker last sent (read by the caller, off the
    /// dispatcher: up to 256 KiB a worker).
    public var workerMetrics: [String]
}

extension Dispatcher: JobDispatch {
    public func live() async -> LiveDispatch? { live() as LiveDispatch }
}

/// Dispatching seen from any jobs replica on PostgreSQL. The elected replica's `Dispatcher` (set
/// by `DispatchLeadership` while it leads) gets created jobs, cancels and webhooks directly when
/// they arrive there; any other replica sends them to it with `NOTIFY jobs_dispatch` (delivered
/// at commit to the leader's `LISTEN`; the leader also catches up with the table every few
/// seconds, so nothing depends on a notification arriving). Progress is the stored one on every
/// replica: the leader stores its workers' progress twice a second, so an app polling through
/// several replicas never sees it go back.
public final class ReplicatedDispatch: JobDispatch {
    let database: PostgresPool
    let logger: Logger
    /// The dispatcher of this replica while it leads.
    let leading = Mutex<Dispatcher?>(nil)
    /// Queued jobs as last counted, and when (a replica that does not lead counts the table at
    /// most once a second).
    let counted = Mutex<(count: Int, at: ContinuousClock.Instant?)>((0, nil))

    public static let channel = "jobs_dispatch"

    public init(database: PostgresPool, logger: Logger) {
        self.database = database
        self.logger = logger
    }

    /// The dispatcher, while this replica leads.
    public var dispatcher: Dispatcher? { leading.withLock { $0 } }

    func lead(_ dispatcher: Dispatcher?) { leading.withLock { $0 = dispatcher } }

    public var queuedCount: Int {
        get async {
            if let dispatcher { return await dispatcher.queuedCount }
            let now = ContinuousClock.now
            if let (count, at) = counted.withLock({ state in state.at.map { (state.count, $0) } }), now - at < .seconds(1) { return count }
            let logger = logger
            let count = (try? await database.connection { db in
                try await db.first("SELECT count(*) FROM jobs_job WHERE status = 'queued'", as: Int.self, logger: logger)
            }) ?? nil
            guard let count else { return counted.withLock { $0.count } }
            counted.withLock { $0 = (count, now) }
            return count
        }
    }

    public func enqueue(_ job: JobRecord) async {
        if let dispatcher { return await dispatcher.enqueue(job) }
        await notify(DispatchNote(kind: .enqueue, jobId: job.id, userId: job.userId))
    }

    public func cancel(_ job: JobRecord) async {
        if let dispatcher { return await dispatcher.cancel(job) }
        await notify(DispatchNote(kind: .cancel, jobId: job.id, userId: job.userId))
    }

    public func poke(jobId: String) async {
        if let dispatcher { return await dispatcher.poke(jobId: jobId) }
        await notify(DispatchNote(kind: .poke, jobId: jobId, userId: ""))
    }

    public func apply(_ controls: DispatchControls) async {
        if let dispatcher { return await dispatcher.apply(controls) }
        await notify(DispatchNote(kind: .controls, jobId: "", userId: ""))
    }

    public func live() async -> LiveDispatch? {
        guard let dispatcher else { return nil }
        return await dispatcher.live()
    }

    public func withLiveProgress(_ job: JobRecord) async -> JobRecord { job }
    public func withLiveProgress(_ jobs: [JobRecord]) async -> [JobRecord] { jobs }
    public func liveProgress(of ids: [String]) async -> [String: Double] { [:] }

    /// Tells the leader, whichever replica it is. A notification lost (no leader now, or the
    /// database unreachable) is made up for by the next leader's recovery and catch-up.
    func notify(_ note: DispatchNote) async {
        let logger = logger
        do {
            let payload = String(decoding: try JSONEncoder().encode(note), as: UTF8.self)
            try await database.connection { db in
                _ = try await db.query("SELECT pg_notify(\(Self.channel), \(payload))", logger: logger)
            }
        } catch {
            logger.debug("cannot notify the dispatcher; its catch-up will find the job", metadata: ["job": "\(note.jobId)", "error": "\(error)"])
        }
    }
}
