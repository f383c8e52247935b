import Bus
import Foundation
import HeapModule
import JobsCore
import Logging
import Messages
import Metrics

/// Hands queued jobs to workers, fairly, and watches the workers.
///
/// Workers speak the worker protocol over a `BusChannel`. The dispatcher keeps, in memory, the
/// fair queue of queued jobs (rebuilt from the database at start-up), the jobs waiting out a retry
/// backoff, and each live worker's capacity, effects, held attempts and last sign of life.
/// Results are accepted from the current attempt only (fencing), and a worker's attempt stays
/// held until its result is durably recorded (the worker re-sends it until then).
///
/// The invariant it keeps: a job the database says is `processing` is held, under its current
/// attempt, by a live worker. Every way that can stop being true is repaired: a worker silent for
/// three of its own heartbeat intervals (announced in `ready`) is dead and its jobs are queued again; an attempt missing from its
/// worker's heartbeats (a lost assignment) is queued again; and `reconcile` finds any other
/// processing job that nobody has held for a grace period (a failed write, a restart) and
/// queues it again. Requeues are fenced by attempt, so a late repair never undoes a result.
public actor Dispatcher {
    struct Worker {
        var id: String
        var capacity: Int
        var effects: Set<String>
        /// The interval the worker announced it sends heartbeats at.
        var heartbeat: Duration
        var lastSeen: ContinuousClock.Instant
        /// Job id to the attempt held (0 while the assignment is being recorded), and since when.
        var running: [String: Held] = [:]
        var free: Int { capacity - running.count }
        /// Silence past this and the worker is dead; an attempt it has not named in its
        /// heartbeats for this long never reached it.
        var deadline: Duration { heartbeat * 3 }
    }

    /// The heartbeat intervals a worker may announce; outside, the nearest bound.
    static let heartbeatRange = Duration.milliseconds(50)...Duration.seconds(60)

    struct Held {
        var attempt: Int
        var since: ContinuousClock.Instant
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
    /// Results being written now: a copy re-sent meanwhile is ignored.
    private var recording: Set<JobAttempt> = []
    /// Tasks recording results now (`recordSoon`).
    private var recordsInFlight = 0
    /// Processing jobs that no worker held at a reconcile, and since when.
    private var unheld: [String: ContinuousClock.Instant] = [:]
    private let failures: FailureLog
    /// The latest metrics each connected worker sent (labelled with its id), by connection.
    private var workerMetrics: [BusChannel.Peer: MetricsSection] = [:]
    /// The largest metrics text kept from one worker.
    static let maxWorkerMetricsBytes = 256 << 10

    public init(channel: BusChannel, store: JobStore, catalog: EffectCatalog, proFirst: Bool = true, heartbeatInterval: Duration = .seconds(1), logger: Logger) {
        self.channel = channel
        self.store = store
        self.catalog = catalog
        self.queue = FairQueue(proFirst: proFirst)
        self.heartbeatInterval = heartbeatInterval
        self.logger = logger
        self.failures = FailureLog(logger: logger)
    }

    /// How long a processing job may go unheld before it is queued again: three heartbeat
    /// intervals, of this service or of the slowest worker connected, the time a worker has to
    /// reconnect and name what it holds.
    var grace: Duration { workers.values.map(\.deadline).reduce(heartbeatInterval * 3, max) }

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
            if let held = worker.running[job.id], held.attempt > 0 {
                channel.send(DispatcherMessage.cancel(JobAttempt(jobId: job.id, attempt: held.attempt)), to: peer)
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
            let heartbeat = ready.heartbeatMilliseconds.map { announced in
                min(max(.milliseconds(announced), Self.heartbeatRange.lowerBound), Self.heartbeatRange.upperBound)
            } ?? heartbeatInterval
            var worker = workers[peer] ?? Worker(id: ready.workerId, capacity: capacity, effects: [], heartbeat: heartbeat, lastSeen: now)
            worker.capacity = capacity
            worker.effects = Set(ready.effects)
            worker.heartbeat = heartbeat
            worker.lastSeen = now
            if workers[peer] == nil {
                logger.info("worker ready", metadata: [
                    "worker": "\(ready.workerId)", "capacity": "\(capacity)", "heartbeat-ms": "\(heartbeat.wholeMilliseconds)",
                ])
            }
            workers[peer] = worker
            JobsMetrics.workersConnected.record(workers.count)
            await dispatch()
            return
        }
        guard workers[peer] != nil else {
            // Not known (the service restarted, or it was declared dead): start over.
            channel.send(DispatcherMessage.reconnect, to: peer)
            return
        }
        workers[peer]?.lastSeen = now
        switch decoded {
        case .ready:
            break
        case .heartbeat(let held):
            await heard(held, from: peer, now: now)
        case .progress(let attempt, let fraction):
            if workers[peer]?.running[attempt.jobId]?.attempt == attempt.attempt, fraction.isFinite {
                progress[attempt.jobId] = min(1, max(progress[attempt.jobId] ?? 0, fraction))
            }
        case .done(let attempt, let output):
            await recordSoon(attempt, from: peer) {
                let outcome = try await self.store.complete(attempt, output: output, now: Date())
                if case .refused = outcome { try await self.store.discardOutput(output, of: attempt, now: Date()) }
                return outcome
            }
        case .failed(let attempt, let error, let retryable):
            await recordSoon(attempt, from: peer) {
                let (outcome, retryAfter) = try await self.store.fail(attempt, error: error, retryable: retryable, now: Date())
                if case .applied(let job) = outcome, job.status == .queued, let retryAfter {
                    await self.delay(job, by: retryAfter)
                }
                return outcome
            }
        case .cancelled(let attempt):
            await recordSoon(attempt, from: peer) { try await self.store.cancelled(attempt, now: Date()) }
        case .metrics(let text):
            if let worker = workers[peer], text.utf8.count <= Self.maxWorkerMetricsBytes {
                workerMetrics[peer] = MetricsSection(labels: ["service": "worker", "worker": worker.id], text: text)
            }
        }
    }

    /// The latest metrics of each connected worker, labelled with its id.
    public func workerSections() -> [MetricsSection] {
        workerMetrics.filter { workers[$0.key] != nil }.values.sorted { ($0.labels["worker"] ?? "") < ($1.labels["worker"] ?? "") }
    }

    /// Records a result in a task of its own, so that the messages behind it are not held up and
    /// results arriving together are written together; past `maxRecordsInFlight` such tasks, in
    /// line (a worker flooding results slows down its own channel, nothing grows).
    private func recordSoon(_ attempt: JobAttempt, from peer: BusChannel.Peer, _ write: @escaping @Sendable () async throws -> JobStore.Outcome) async {
        guard recordsInFlight < Self.maxRecordsInFlight else {
            await record(attempt, from: peer, write)
            return
        }
        recordsInFlight += 1
        Task {
            await self.record(attempt, from: peer, write)
            self.recorded()
        }
    }

    private func recorded() { recordsInFlight -= 1 }

    /// The most results being recorded in tasks of their own at once.
    static let maxRecordsInFlight = 1024

    /// Writes a worker's result, then tells the worker it is recorded (or refused) and frees the
    /// slot. If the write fails the attempt stays held and the worker sends the result again.
    private func record(_ attempt: JobAttempt, from peer: BusChannel.Peer, _ write: @escaping @Sendable () async throws -> JobStore.Outcome) async {
        guard recording.insert(attempt).inserted else { return }
        defer { recording.remove(attempt) }
        let since = workers[peer]?.running[attempt.jobId].flatMap { $0.attempt == attempt.attempt ? $0.since : nil }
        do {
            let outcome = try await write()
            failures.recovered("record")
            finished(attempt, on: peer)
            switch outcome {
            case .applied(let job):
                JobsMetrics.finished(job, runningSince: since)
                channel.send(DispatcherMessage.recorded(attempt), to: peer)
            case .alreadyRecorded:
                // Sent again before our `recorded` reached the worker.
                channel.send(DispatcherMessage.recorded(attempt), to: peer)
            case .refused(let reason):
                logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
                channel.send(DispatcherMessage.refused(attempt, reason: reason), to: peer)
            }
        } catch {
            failures.record("record", "cannot record workers' results yet; they are kept and sent again: \(error)")
        }
        await dispatch()
    }

    private func delay(_ job: JobRecord, by retryAfter: Duration) {
        delayed.insert(Delayed(due: .now.advanced(by: retryAfter), job: Self.queued(job)))
    }

    /// A worker's heartbeat names the attempts it holds. One assigned to it more than `grace`
    /// ago that it does not name never reached it (or it forgot it): queued again. One it names
    /// that nobody holds here (this service restarted meanwhile) is taken back if it is still
    /// the job's current attempt.
    private func heard(_ held: [JobAttempt], from peer: BusChannel.Peer, now: ContinuousClock.Instant) async {
        guard let worker = workers[peer] else { return }
        let named = Set(held)
        for (jobId, holding) in worker.running where holding.attempt > 0 && holding.since.duration(to: now) > worker.deadline {
            let attempt = JobAttempt(jobId: jobId, attempt: holding.attempt)
            if !named.contains(attempt), !recording.contains(attempt) {
                workers[peer]?.running[jobId] = nil
                progress[jobId] = nil
                await requeue(attempt, reason: "worker \(worker.id) does not hold the job", cause: .assignmentLost)
            }
        }
        let unknown = held.filter { attempt in !workers.values.contains { $0.running[attempt.jobId] != nil } }
        guard !unknown.isEmpty, let stored = try? await store.jobs(unknown.map(\.jobId)) else { return }
        for job in stored where job.status == .processing && unknown.contains(JobAttempt(jobId: job.id, attempt: job.attempts)) {
            guard workers[peer] != nil, !workers.values.contains(where: { $0.running[job.id] != nil }) else { continue }
            workers[peer]?.running[job.id] = Held(attempt: job.attempts, since: now)
            unheld[job.id] = nil
        }
    }

    /// Queues a processing attempt again (fenced: nothing happens if it is no longer current).
    private func requeue(_ attempt: JobAttempt, reason: String, cause: JobsMetrics.RequeueCause) async {
        do {
            if let job = try await store.requeue(attempt, reason: reason, now: Date()), job.status == .queued {
                queue.push(Self.queued(job), atFront: true)
                Counter(label: "jobs_requeued_total", dimensions: [("cause", cause.rawValue)]).increment()
            }
        } catch {
            failures.record("requeue", "cannot requeue jobs yet; the next reconcile tries again: \(error)")
        }
    }

    /// Finds processing jobs that no worker holds under their current attempt and, once that
    /// has lasted `grace`, queues them again. Runs every few seconds.
    public func reconcile(now: ContinuousClock.Instant = .now) async {
        let processing: [JobAttempt]
        do {
            processing = try await store.processingAttempts()
        } catch is CancellationError {
            return
        } catch {
            failures.record("reconcile", "cannot read processing jobs to reconcile: \(error)")
            return
        }
        var seen: Set<String> = []
        for attempt in processing {
            seen.insert(attempt.jobId)
            let held = workers.values.contains { worker in
                guard let holding = worker.running[attempt.jobId] else { return false }
                return holding.attempt == 0 || holding.attempt == attempt.attempt
            }
            if held || recording.contains(attempt) {
                unheld[attempt.jobId] = nil
                continue
            }
            guard let since = unheld[attempt.jobId] else {
                unheld[attempt.jobId] = now
                continue
            }
            if since.duration(to: now) >= grace {
                unheld[attempt.jobId] = nil
                logger.warning("job processing with no worker holding it; queued again", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)"])
                await requeue(attempt, reason: "no worker held the job", cause: .unheld)
            }
        }
        unheld = unheld.filter { seen.contains($0.key) }
        await dispatch()
    }

    /// Sends heartbeats, buries dead workers, releases due retries and dispatches.
    public func tick() async {
        let now = ContinuousClock.now
        for (peer, worker) in workers where worker.lastSeen.duration(to: now) > worker.deadline {
            workers[peer] = nil
            workerMetrics[peer] = nil
            JobsMetrics.workersConnected.record(workers.count)
            logger.warning("worker lost", metadata: ["worker": "\(worker.id)", "jobs": "\(worker.running.count)"])
            for (jobId, holding) in worker.running where holding.attempt > 0 {
                progress[jobId] = nil
                await requeue(JobAttempt(jobId: jobId, attempt: holding.attempt), reason: "worker \(worker.id) was lost", cause: .workerLost)
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
        if workers[peer]?.running[attempt.jobId]?.attempt == attempt.attempt {
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

    /// The live progress of those of these jobs that are running and have reported some.
    public func liveProgress(of ids: [String]) -> [String: Double] {
        var found: [String: Double] = [:]
        for id in ids { if let fraction = progress[id] { found[id] = fraction } }
        return found
    }

    /// The jobs as stored, each with its live progress laid over it.
    public func withLiveProgress(_ jobs: [JobRecord]) -> [JobRecord] {
        jobs.map { withLiveProgress($0) }
    }

    /// Hands out queued jobs while some worker has a free slot for them. The starts of all the
    /// jobs handed out at once are written together (one transaction), each slot held meanwhile.
    private func dispatch() async {
        var batch: [(peer: BusChannel.Peer, job: QueuedJob)] = []
        while let (peer, job) = nextAssignment() {
            workers[peer]?.running[job.jobId] = Held(attempt: 0, since: .now)
            batch.append((peer, job))
        }
        guard !batch.isEmpty else { return }
        let starts = await withTaskGroup(of: (Int, Result<JobRecord?, any Error>).self) { [store] group in
            for (index, item) in batch.enumerated() {
                group.addTask {
                    do { return (index, .success(try await store.start(item.job.jobId, now: Date()))) } catch { return (index, .failure(error)) }
                }
            }
            var results = [Result<JobRecord?, any Error>](repeating: .success(nil), count: batch.count)
            for await (index, result) in group { results[index] = result }
            return results
        }
        for ((peer, job), result) in zip(batch, starts) {
            do {
                guard let started = try result.get() else {
                    // Cancelled (or otherwise taken) meanwhile.
                    workers[peer]?.running[job.jobId] = nil
                    continue
                }
                failures.recovered("start")
                let attempt = JobAttempt(jobId: started.id, attempt: started.attempts)
                guard workers[peer] != nil, let effect = catalog.effect(started.effectId) else {
                    workers[peer]?.running[job.jobId] = nil
                    await requeue(attempt, reason: "worker lost before assignment", cause: .workerLost)
                    continue
                }
                workers[peer]?.running[job.jobId] = Held(attempt: started.attempts, since: .now)
                if started.attempts == 1 {
                    JobsMetrics.waitBeforeAssignment.recordSeconds(max(0, Date().timeIntervalSince(started.createdAt)))
                }
                channel.send(DispatcherMessage.assign(JobAssignment(
                    attempt: attempt, userId: started.userId, imageKey: started.imageKey,
                    effect: effect, parameters: started.parameters, prompt: started.prompt
                )), to: peer)
            } catch {
                workers[peer]?.running[job.jobId] = nil
                queue.push(job, atFront: true)
                failures.record("start", "cannot start jobs yet; they stay queued: \(error)")
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
