import Bus
import Foundation
import HeapModule
import JobsCore
import Logging
import Messages

/// Hands queued jobs to workers, fairly, and watches the workers.
///
/// Workers speak the worker protocol over a `BusChannel`. The dispatcher keeps, in memory, the
/// fair queue of queued jobs (rebuilt from the database at start-up), the jobs waiting out a retry
/// backoff, and each live worker's capacity, effects, running attempts and last sign of life.
/// A worker silent for three heartbeat intervals is dead: its jobs go back to the front of their
/// users' queues. Results are accepted from the current attempt only (fencing).
public actor Dispatcher {
    struct Worker {
        var id: String
        var capacity: Int
        var effects: Set<String>
        var lastSeen: ContinuousClock.Instant
        /// Job id to attempt number (0 while the assignment is being recorded).
        var running: [String: Int] = [:]
        var free: Int { capacity - running.count }
    }

    struct Delayed: Comparable {
        var due: ContinuousClock.Instant
        var job: QueuedJob
        static func < (lhs: Delayed, rhs: Delayed) -> Bool { lhs.due < rhs.due }
        static func == (lhs: Delayed, rhs: Delayed) -> Bool { lhs.due == rhs.due && lhs.job == rhs.job }
    }

    private let channel: BusChannel
    private let store: JobStore
    private let catalog: EffectCatalog
    private let logger: Logger
    private let heartbeatInterval: Duration
    private var workers: [BusChannel.Peer: Worker] = [:]
    private var queue: FairQueue
    private var delayed = Heap<Delayed>()
    private var lastHeartbeat = ContinuousClock.now
    /// Progress of running jobs. Progress is not a state change: it is kept here, not written to
    /// disk and the outbox (a worker reports it several times a job).
    private var progress: [String: Double] = [:]

    public init(channel: BusChannel, store: JobStore, catalog: EffectCatalog, proFirst: Bool = true, heartbeatInterval: Duration = .seconds(1), logger: Logger) {
        self.channel = channel
        self.store = store
        self.catalog = catalog
        self.queue = FairQueue(proFirst: proFirst)
        self.heartbeatInterval = heartbeatInterval
        self.logger = logger
    }

    /// Jobs waiting for a worker, backoffs included.
    public var queuedCount: Int { queue.count + delayed.count }

    /// Queues jobs recovered from the database at start-up.
    public func load(_ jobs: [JobRecord]) async {
        for job in jobs { queue.push(Self.queued(job)) }
        await dispatch()
    }

    /// Queues a newly created job and hands it out if a worker is free.
    public func enqueue(_ job: JobRecord) async {
        queue.push(Self.queued(job))
        await dispatch()
    }

    /// A cancel (or a purge) was recorded: drop the job from the queue, or tell the worker that
    /// runs it. A job waiting out a retry backoff is skipped when its turn comes: it is no longer
    /// queued in the database.
    public func cancel(_ job: JobRecord) {
        if queue.remove(jobId: job.id, userId: job.userId) { return }
        for (peer, worker) in workers {
            if let attempt = worker.running[job.id], attempt > 0 {
                channel.send(DispatcherMessage.cancel(JobAttempt(jobId: job.id, attempt: attempt)), to: peer)
            }
        }
    }

    /// Handles one message from a worker.
    public func receive(_ message: BusChannel.Message) async {
        guard let peer = message.peer, let decoded = BusChannel.decode(WorkerMessage.self, message) else {
            logger.debug("dropped an undecodable worker message")
            return
        }
        let now = ContinuousClock.now
        if case .ready(let ready) = decoded {
            let capacity = min(max(ready.capacity, 1), 256)
            var worker = workers[peer] ?? Worker(id: ready.workerId, capacity: capacity, effects: [], lastSeen: now)
            worker.capacity = capacity
            worker.effects = Set(ready.effects)
            worker.lastSeen = now
            if workers[peer] == nil {
                logger.info("worker ready", metadata: ["worker": "\(ready.workerId)", "capacity": "\(capacity)"])
            }
            workers[peer] = worker
            await dispatch()
            return
        }
        guard workers[peer] != nil else {
            // Not known (the service restarted, or it was declared dead): start over.
            channel.send(DispatcherMessage.reconnect, to: peer)
            return
        }
        workers[peer]?.lastSeen = now
        do {
            switch decoded {
            case .ready, .heartbeat:
                break
            case .progress(let attempt, let fraction):
                if workers[peer]?.running[attempt.jobId] == attempt.attempt, fraction.isFinite {
                    progress[attempt.jobId] = min(1, max(progress[attempt.jobId] ?? 0, fraction))
                }
            case .done(let attempt, let output):
                finished(attempt, on: peer)
                if case .refused(let reason) = try await store.complete(attempt, output: output, now: Date()) {
                    logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
                    channel.send(DispatcherMessage.refused(attempt, reason: reason), to: peer)
                    try await store.discardOutput(output, of: attempt, now: Date())
                }
                await dispatch()
            case .failed(let attempt, let error, let retryable):
                finished(attempt, on: peer)
                let (outcome, retryAfter) = try await store.fail(attempt, error: error, retryable: retryable, now: Date())
                if case .applied(let job) = outcome, job.status == .queued, let retryAfter {
                    delayed.insert(Delayed(due: .now.advanced(by: retryAfter), job: Self.queued(job)))
                }
                await dispatch()
            case .cancelled(let attempt):
                finished(attempt, on: peer)
                _ = try await store.cancelled(attempt, now: Date())
                await dispatch()
            }
        } catch {
            logger.error("cannot record a worker report", metadata: ["error": "\(error)"])
        }
    }

    /// Sends heartbeats, buries dead workers, releases due retries and dispatches.
    public func tick() async {
        let now = ContinuousClock.now
        let deadline = heartbeatInterval * 3
        for (peer, worker) in workers where worker.lastSeen.duration(to: now) > deadline {
            workers[peer] = nil
            logger.warning("worker lost", metadata: ["worker": "\(worker.id)", "jobs": "\(worker.running.count)"])
            for (jobId, attempt) in worker.running where attempt > 0 {
                progress[jobId] = nil
                do {
                    if let job = try await store.requeue(JobAttempt(jobId: jobId, attempt: attempt), reason: "worker \(worker.id) was lost", now: Date()),
                       job.status == .queued {
                        queue.push(Self.queued(job), atFront: true)
                    }
                } catch {
                    logger.error("cannot requeue a lost worker's job", metadata: ["job": "\(jobId)", "error": "\(error)"])
                }
            }
        }
        if lastHeartbeat.duration(to: now) >= heartbeatInterval {
            lastHeartbeat = now
            for peer in workers.keys { channel.send(DispatcherMessage.heartbeat, to: peer) }
        }
        while let first = delayed.min, first.due <= now {
            queue.push(delayed.removeMin().job)
        }
        await dispatch()
    }

    private func finished(_ attempt: JobAttempt, on peer: BusChannel.Peer) {
        if workers[peer]?.running[attempt.jobId] == attempt.attempt {
            workers[peer]?.running[attempt.jobId] = nil
            progress[attempt.jobId] = nil
        }
    }

    /// The job as stored, with the live progress of a running attempt laid over it.
    public func withLiveProgress(_ job: JobRecord) -> JobRecord {
        guard job.status == .processing, let fraction = progress[job.id] else { return job }
        var live = job
        live.progress = fraction
        return live
    }

    /// Hands out queued jobs while some worker has a free slot for them.
    private func dispatch() async {
        while let (peer, job) = nextAssignment() {
            workers[peer]?.running[job.jobId] = 0
            do {
                guard let started = try await store.start(job.jobId, now: Date()) else {
                    // Cancelled (or otherwise taken) meanwhile.
                    workers[peer]?.running[job.jobId] = nil
                    continue
                }
                let attempt = JobAttempt(jobId: started.id, attempt: started.attempts)
                guard workers[peer] != nil, let effect = catalog.effect(started.effectId) else {
                    if let again = try await store.requeue(attempt, reason: "worker lost before assignment", now: Date()), again.status == .queued {
                        queue.push(Self.queued(again), atFront: true)
                    }
                    continue
                }
                workers[peer]?.running[job.jobId] = started.attempts
                channel.send(DispatcherMessage.assign(JobAssignment(
                    attempt: attempt, userId: started.userId, imageKey: started.imageKey,
                    effect: effect, parameters: started.parameters, prompt: started.prompt
                )), to: peer)
            } catch {
                workers[peer]?.running[job.jobId] = nil
                queue.push(job, atFront: true)
                logger.error("cannot start a job", metadata: ["job": "\(job.jobId)", "error": "\(error)"])
                return
            }
        }
    }

    /// The worker with the most free slots that can take the next fair job, and that job.
    private func nextAssignment() -> (BusChannel.Peer, QueuedJob)? {
        let candidates = workers.filter { $0.value.free > 0 }.sorted { $0.value.free > $1.value.free }
        for (peer, worker) in candidates {
            if let job = queue.pop(where: { worker.effects.contains("*") || worker.effects.contains($0.effectId) }) {
                return (peer, job)
            }
        }
        return nil
    }

    static func queued(_ job: JobRecord) -> QueuedJob {
        QueuedJob(jobId: job.id, userId: job.userId, isPro: job.isPro, effectId: job.effectId)
    }
}
