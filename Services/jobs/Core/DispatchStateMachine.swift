import Foundation
import HeapModule
import Messages

/// The dispatcher's rules as a pure state machine: which worker gets which job, who is alive,
/// what is held, what to repair. Events go in (a job created, a worker's message, the result of
/// a write, a tick carrying the time) and actions come out (send this to that worker, write these
/// starts, record this result, queue this attempt again, look these jobs up). The owner (the
/// `Dispatcher` actor) does the I/O and feeds the outcome of each write back in as another event,
/// so the state is whole between any two events and never waits on a database in the middle of
/// a change. The time is always an argument: tests move it by hand.
///
/// The invariant it keeps: a job the database says is `processing` is held, under its current
/// attempt, by a live worker. Every way that can stop being true is repaired: a worker silent for
/// three of its own heartbeat intervals (announced in `ready`) is dead and its jobs are queued
/// again (those at a provider after `lostWorkerGrace`, see `stranded`); an attempt its worker's
/// heartbeats have not named for that long never reached it and
/// is queued again; and `reconcile` finds any other processing job that nobody has held for a
/// grace period (a failed write, a restart) and queues it again. Requeues are fenced by attempt
/// in the store, so a late repair never undoes a result.
public struct DispatchStateMachine<Peer: Hashable & Sendable>: Sendable {
    public typealias Instant = ContinuousClock.Instant

    /// What the owner must do.
    public enum Action: Sendable, Equatable {
        /// Send this message to this worker.
        case send(Peer, DispatcherMessage)
        /// Write the starts of these jobs (one transaction), each for the worker named, then call
        /// `started` with the outcome of each.
        case start([Start])
        /// Write this result of this worker's attempt, then call `recorded`.
        case record(Peer, JobAttempt, WorkerResult)
        /// Queue this processing attempt again in the store (fenced by attempt), then call
        /// `requeued`.
        case requeue(JobAttempt, reason: String, cause: RequeueCause)
        /// Read these jobs, which a worker names but nobody holds here (this service restarted),
        /// then call `claimed` with those still processing under these attempts.
        case lookUp(Peer, [JobAttempt])
        /// Sign fresh URLs for an attempt this worker holds, and send them (`renewed`).
        case renew(Peer, JobAttempt)
        /// Write the provider request this worker's attempt submitted, then call
        /// `submissionRecorded`.
        case recordSubmission(Peer, JobAttempt, ProviderRequest)
        /// For logs and metrics: a worker joined (holding up to `capacity` jobs: those it runs at
        /// once and those it prefetches) or was lost, with the count of workers now.
        case workerJoined(id: String, capacity: Int, heartbeat: Duration, connected: Int)
        case workerLost(id: String, jobs: Int, connected: Int)
        /// For logs and metrics: a worker that said `leaving` went quiet holding nothing (a
        /// clean scale-down, not a loss).
        case workerLeft(id: String, connected: Int)
        /// For metrics: a result was recorded; the job is in its new state, and had been running
        /// since then (nil if not known).
        case finished(JobRecord, runningSince: Instant?)
        /// For metrics: a job was handed to a worker for the first time.
        case firstAssignment(JobRecord)
        /// A result was refused by the store (logged).
        case refused(JobAttempt, reason: String)
    }

    public struct Start: Sendable, Equatable {
        public var peer: Peer
        public var job: QueuedJob
        public init(peer: Peer, job: QueuedJob) {
            self.peer = peer
            self.job = job
        }
    }

    /// A worker's result, to be recorded.
    public typealias WorkerResult = JobResult

    /// What a start write did.
    public enum StartOutcome: Sendable, Equatable {
        /// The job is processing under a new attempt.
        case started(JobRecord)
        /// It was no longer queued (cancelled meanwhile).
        case gone
        /// The write failed: the job stays queued.
        case failed
    }

    /// What a result write did.
    public enum RecordOutcome: Sendable, Equatable {
        /// Applied: the job is now in this state (queued again after `retryAfter`, for a retry).
        case applied(JobRecord, retryAfter: Duration?)
        /// Recorded before (the worker sent it again).
        case alreadyRecorded
        /// Refused: stale, or the job is not processing.
        case refused(String)
        /// The write failed: the worker still holds the attempt and sends it again.
        case failed
    }

    /// Why a processing job was queued again.
    public enum RequeueCause: String, Sendable {
        /// Its worker went silent for three of its heartbeat intervals.
        case workerLost = "worker_lost"
        /// Its worker's heartbeats did not name it: the assignment never arrived.
        case assignmentLost = "assignment_lost"
        /// No worker held it for a grace period (found by the reconcile).
        case unheld
        /// Its worker gave it back unstarted as it stopped.
        case returned
    }

    public struct Configuration: Sendable {
        /// The service's own heartbeat interval: sent to every worker at this pace, and assumed
        /// for a worker that announces none.
        public var heartbeat: Duration
        /// The intervals a worker may announce; outside, the nearest bound.
        public var heartbeatRange: ClosedRange<Duration>
        /// The most jobs one worker runs at once, and the most it may prefetch besides, whatever
        /// it announces.
        public var maxCapacity: Int
        /// PRO users' jobs go first.
        public var proFirst: Bool
        /// The most jobs of each provider (`gemini`, `openai`, `fal`, `remote`) held by workers
        /// at once, generations waiting in a provider's queue aside: past it, that provider's
        /// jobs wait in this queue, not in a worker. A provider not named has no limit.
        public var providerLimits: [String: Int]
        /// The most results being written at once; past it, a result is dropped for now (its
        /// worker sends it again with its next heartbeat).
        public var maxRecording: Int
        /// How long a lost worker's generations at a provider wait for it to come back before
        /// they are queued again (`stranded`); zero: at once, as local jobs are.
        public var lostWorkerGrace: Duration

        public init(heartbeat: Duration = .seconds(1), heartbeatRange: ClosedRange<Duration> = .milliseconds(50)...(.seconds(60)),
                    maxCapacity: Int = 256, proFirst: Bool = true, maxRecording: Int = 4096, providerLimits: [String: Int] = [:],
                    lostWorkerGrace: Duration = .seconds(30)) {
            self.lostWorkerGrace = lostWorkerGrace
            self.providerLimits = providerLimits
            self.heartbeat = heartbeat
            self.heartbeatRange = heartbeatRange
            self.maxCapacity = maxCapacity
            self.proFirst = proFirst
            self.maxRecording = maxRecording
        }
    }

    struct Worker: Sendable {
        var id: String
        /// Jobs it holds at most: those it runs at once plus those it prefetches.
        var capacity: Int
        var effects: Set<String>
        /// The interval the worker announced it sends heartbeats at.
        var heartbeat: Duration
        var lastSeen: Instant
        /// Job id to what the worker holds of it, taking one of its slots.
        var held: [String: Held] = [:]
        /// Job id to the attempts whose generations wait in a provider's queue: the worker still
        /// holds them (and names them in heartbeats), but they take no slot.
        var awaiting: [String: Held] = [:]
        /// It said it is stopping: it gets no more jobs.
        var leaving = false
        /// An operator drained it: it finishes what it holds and gets no more jobs.
        var drained = false
        /// Where it runs and what it runs, as it said (older workers say neither).
        var host: String?
        var version: String?
        var prefetch = 0
        /// It takes several messages in one (`all`).
        var batches = false
        /// Jobs in its slots whose results are being written, or whose models answered (the
        /// worker said `answered`): it has finished with their slots, which go to the next jobs
        /// (a result's in the same transaction as their starts).
        var finishing = 0
        var free: Int { leaving || drained ? 0 : capacity - held.count + finishing }
        /// Silence past this and the worker is dead; an attempt it has not named in its
        /// heartbeats for this long never reached it.
        var deadline: Duration { heartbeat * 3 }

        func accepts(_ job: QueuedJob) -> Bool { effects.contains("*") || effects.contains(job.effectId) }

        /// What the worker holds of a job, in a slot or waiting on a provider.
        func holds(_ jobId: String) -> Held? { held[jobId] ?? awaiting[jobId] }

        /// The worker no longer holds the job.
        mutating func drop(_ jobId: String) {
            settle(jobId)
            held[jobId] = nil
            awaiting[jobId] = nil
        }

        /// The attempt it holds in a slot needs the slot no more (its result is being written, or
        /// its model answered): the slot counts as free. False if it holds no such slot (another
        /// attempt, or one finishing already).
        @discardableResult
        mutating func finish(_ attempt: JobAttempt) -> Bool {
            guard var slot = held[attempt.jobId], slot.attempt == attempt.attempt, !slot.finishing else { return false }
            slot.finishing = true
            held[attempt.jobId] = slot
            finishing += 1
            return true
        }

        /// Its result's write is over (dropped next, or kept after a failed write: its slot
        /// counts as taken again until the worker sends the result again).
        mutating func settle(_ jobId: String) {
            guard held[jobId]?.finishing == true else { return }
            held[jobId]?.finishing = false
            finishing -= 1
        }

        /// Everything it holds, slots and provider waits.
        var everything: [(String, Held)] { Array(held) + Array(awaiting) }
    }

    struct Held: Sendable, Equatable {
        /// 0 while its start is being written.
        var attempt: Int
        var since: Instant
        /// A cancel arrived while the start was being written: sent right after the assignment.
        var cancelAfterStart = false
        /// The provider its effect calls, for the per-provider limit.
        var provider: String? = nil
        /// Its result is being written (`Worker.finish`).
        var finishing = false
    }

    struct Delayed: Comparable, Sendable {
        var due: Instant
        var job: QueuedJob
        static func < (lhs: Delayed, rhs: Delayed) -> Bool { lhs.due < rhs.due }
    }

    public let configuration: Configuration
    let catalog: EffectCatalog
    var workers: [Peer: Worker] = [:]
    var queue: FairQueue
    /// Jobs waiting out a retry backoff, and the ids still waiting (a cancel removes the id; the
    /// heap entry is skipped when due).
    var delayed = Heap<Delayed>()
    var delayedIds: Set<String> = []
    var lastHeartbeat: Instant?
    /// Progress of running jobs (not a state change: kept here only).
    var progress: [String: Double] = [:]
    /// Results being written now: a copy sent again meanwhile is ignored.
    var recording: Set<JobAttempt> = []
    /// Peers whose claims are being looked up.
    var lookingUp: Set<Peer> = []
    /// Provider requests being written now: a copy sent again meanwhile is ignored.
    var submitting: Set<JobAttempt> = []
    /// Processing jobs that no worker held at a reconcile, and since when.
    var unheld: [String: Instant] = [:]
    /// The generations of lost workers that wait for them: job id to the attempt, its worker,
    /// its provider and when it is queued again. A worker that lost only its link to this
    /// service (a partition, a blip longer than three heartbeats) still holds its request at the
    /// provider: when it comes back and names the attempt, it holds it again (through `lookUp`
    /// and `claimed`, as after a restart), and the model is not called twice, nor billed twice.
    var stranded: [String: Stranded] = [:]

    struct Stranded: Sendable, Equatable {
        var attempt: Int
        var workerId: String
        /// The provider it counts against (none for one waiting in the provider's queue).
        var provider: String?
        var until: Instant
    }

    public init(catalog: EffectCatalog, configuration: Configuration = Configuration()) {
        self.catalog = catalog
        self.configuration = configuration
        self.queue = FairQueue(proFirst: configuration.proFirst)
    }

    // MARK: Queries

    /// Jobs waiting for a worker, backoffs included.
    public var queuedCount: Int { queue.count + delayedIds.count }

    /// What operators set (`DispatchControls`): paused effects and providers, live limits,
    /// drained workers.
    public private(set) var controls = DispatchControls()

    /// The providers' limits in force: the configured ones, with the operators' over them.
    public var providerLimits: [String: Int] { configuration.providerLimits.merging(controls.providerLimits) { _, live in live } }

    /// Puts operators' controls in force: a resumed effect's jobs, or a raised limit's, are
    /// handed out at once; a drained worker gets nothing more (and keeps what it holds).
    public mutating func apply(_ controls: DispatchControls, now: Instant) -> [Action] {
        self.controls = controls
        let drained = Set(controls.drainedWorkers)
        for (peer, worker) in workers { workers[peer]?.drained = drained.contains(worker.id) }
        return dispatch(now: now)
    }

    /// A worker as operators see it.
    public struct WorkerView: Sendable, Equatable {
        public var id: String
        public var host: String?
        public var version: String?
        public var capacity: Int
        public var prefetch: Int
        public var effects: [String]
        /// Jobs in its slots, and generations it waits for at providers.
        public var running: Int
        public var awaiting: Int
        public var drained: Bool
        public var leaving: Bool
        /// How long ago it was last heard from.
        public var silentFor: Duration
    }

    public func workerViews(now: Instant) -> [WorkerView] {
        workers.values.map { worker in
            WorkerView(id: worker.id, host: worker.host, version: worker.version, capacity: worker.capacity - worker.prefetch, prefetch: worker.prefetch,
                       effects: worker.effects.sorted(), running: worker.held.count, awaiting: worker.awaiting.count, drained: worker.drained,
                       leaving: worker.leaving, silentFor: worker.lastSeen.duration(to: now))
        }.sorted { $0.id < $1.id }
    }

    /// Workers connected now.
    public var workerCount: Int { workers.count }

    /// The id of a connected worker.
    public func workerId(_ peer: Peer) -> String? { workers[peer]?.id }

    /// Whether a connected worker takes several messages in one (`DispatcherMessage.all`).
    public func takesBatches(_ peer: Peer) -> Bool { workers[peer]?.batches ?? false }

    /// How long a processing job may go unheld before it is queued again: three heartbeat
    /// intervals, of this service or of the slowest worker connected, the time a worker has to
    /// reconnect and name what it holds.
    public var grace: Duration { workers.values.map(\.deadline).reduce(configuration.heartbeat * 3, max) }

    /// The live progress of those of these jobs that are running and have reported some.
    public func progress(of ids: [String]) -> [String: Double] {
        var found: [String: Double] = [:]
        for id in ids { if let fraction = progress[id] { found[id] = fraction } }
        return found
    }

    /// The live progress of every running job that has reported some.
    public var runningProgress: [String: Double] { progress }

    /// Whether the job is queued here, waiting out a backoff, or held by a worker.
    public func knows(jobId: String, userId: String) -> Bool {
        queue.contains(jobId: jobId, userId: userId) || delayedIds.contains(jobId) || holder(of: jobId) != nil || stranded[jobId] != nil
    }

    /// Which worker holds a job, and under which attempt (0 while its start is written).
    public func holder(of jobId: String) -> (peer: Peer, attempt: Int)? {
        for (peer, worker) in workers { if let held = worker.holds(jobId) { return (peer, held.attempt) } }
        return nil
    }

    /// Generations waiting in providers' queues, held by workers without a slot.
    public var awaitingCount: Int { workers.values.reduce(0) { $0 + $1.awaiting.count } }

    /// Worker slots taken now (jobs running or prefetched; generations waiting take none).
    public var slotsHeld: Int { workers.values.reduce(0) { $0 + $1.held.count } }

    /// Jobs held in workers' slots now, by provider (those that call one).
    public func activeByProvider() -> [String: Int] {
        var active: [String: Int] = [:]
        for worker in workers.values {
            for held in worker.held.values { if let provider = held.provider { active[provider, default: 0] += 1 } }
        }
        // A stranded call is still running at its provider.
        for job in stranded.values { if let provider = job.provider { active[provider, default: 0] += 1 } }
        return active
    }

    /// Generations of lost workers waiting for them to come back.
    public var strandedCount: Int { stranded.count }

    // MARK: Events: jobs

    /// Jobs to queue (new ones, or those recovered at start-up), handed out if workers are free.
    public mutating func enqueue(_ jobs: [QueuedJob], now: Instant) -> [Action] {
        for job in jobs { queue.push(job) }
        return dispatch(now: now)
    }

    /// A cancel (or a purge) was recorded: drop the job from the queue or its backoff, or tell
    /// the worker that runs it (right after its assignment, if its start is being written).
    public mutating func cancel(jobId: String, userId: String) -> [Action] {
        if queue.remove(jobId: jobId, userId: userId) { return [] }
        if delayedIds.remove(jobId) != nil { return [] }
        // Waiting for its lost worker: the requeue of a job whose cancel is recorded cancels it
        // (and releases its charge); its worker, if it comes back, names an attempt no longer
        // processing, which is not claimed.
        if let job = stranded.removeValue(forKey: jobId) {
            return [.requeue(JobAttempt(jobId: jobId, attempt: job.attempt), reason: "cancelled while its worker was away", cause: .workerLost)]
        }
        guard let (peer, attempt) = holder(of: jobId) else { return [] }
        if attempt == 0 {
            workers[peer]?.held[jobId]?.cancelAfterStart = true
            return []
        }
        return [.send(peer, .cancel(JobAttempt(jobId: jobId, attempt: attempt)))]
    }

    // MARK: Events: workers

    /// One message from a worker (metrics aside, which are not the state machine's business).
    public mutating func receive(_ message: WorkerMessage, from peer: Peer, now: Instant) -> [Action] {
        if case .ready(let ready) = message { return self.ready(ready, from: peer, now: now) }
        if case .all(let messages) = message {
            var actions: [Action] = []
            for message in messages {
                if case .all = message { continue }
                actions += receive(message, from: peer, now: now)
            }
            return actions
        }
        guard workers[peer] != nil else {
            // Not known (the service restarted, or it was declared dead): start over.
            return [.send(peer, .reconnect)]
        }
        workers[peer]?.lastSeen = now
        switch message {
        case .ready, .metrics, .all:
            return []
        case .heartbeat(let held):
            return heard(held, from: peer, now: now)
        case .progress(let attempt, let fraction):
            if workers[peer]?.holds(attempt.jobId)?.attempt == attempt.attempt, fraction.isFinite {
                progress[attempt.jobId] = min(1, max(progress[attempt.jobId] ?? 0, fraction))
            }
            return []
        case .done(let attempt, let output):
            return record(attempt, .done(output), from: peer, now: now)
        case .failed(let attempt, let error, let retryable):
            return record(attempt, .failed(error: error, retryable: retryable), from: peer, now: now)
        case .cancelled(let attempt):
            return record(attempt, .cancelled, from: peer, now: now)
        case .leaving(let returned):
            return leaving(peer, returned: returned)
        case .answered(let attempt):
            // Only for an attempt in one of the worker's slots under its current number.
            guard workers[peer]?.finish(attempt) == true else { return [] }
            workers[peer]?.held[attempt.jobId]?.provider = nil
            return dispatch(now: now)
        case .renew(let attempt):
            // Only for an attempt the worker holds under its current number.
            guard workers[peer]?.holds(attempt.jobId)?.attempt == attempt.attempt else { return [] }
            return [.renew(peer, attempt)]
        case .submitted(let attempt, let request):
            // Only for an attempt the worker holds (after this service restarted, once its
            // claim is looked up: the worker sends it again with its next heartbeat).
            guard workers[peer]?.holds(attempt.jobId)?.attempt == attempt.attempt,
                  submitting.insert(attempt).inserted else { return [] }
            return [.recordSubmission(peer, attempt, request)]
        }
    }

    /// The provider's webhook came for a job: the worker waiting on its generation asks now.
    public func poke(jobId: String) -> [Action] {
        guard let (peer, attempt) = holder(of: jobId), attempt > 0 else { return [] }
        return [.send(peer, .poke(JobAttempt(jobId: jobId, attempt: attempt)))]
    }

    /// What writing a provider request did.
    public enum SubmissionOutcome: Sendable, Equatable {
        /// Durable (now or before): the attempt waits on the provider without a slot.
        case recorded
        /// Refused: the attempt is no longer the job's current one (requeued, cancelled).
        case refused(String)
        /// The write failed: the worker sends it again.
        case failed
    }

    /// A provider request was written (or not). Once it is durable the job leaves its worker's
    /// slot (the worker keeps waiting on the provider without one) and the slot is handed out.
    public mutating func submissionRecorded(_ attempt: JobAttempt, from peer: Peer, outcome: SubmissionOutcome, now: Instant) -> [Action] {
        submitting.remove(attempt)
        switch outcome {
        case .failed:
            return []
        case .refused(let reason):
            // Stale: the worker stops sending it and stops the generation.
            return [.refused(attempt, reason: reason), .send(peer, .submissionRecorded(attempt)), .send(peer, .cancel(attempt))]
        case .recorded:
            if var held = workers[peer]?.held[attempt.jobId], held.attempt == attempt.attempt {
                workers[peer]?.settle(attempt.jobId)
                held.provider = nil
                held.finishing = false
                workers[peer]?.held[attempt.jobId] = nil
                workers[peer]?.awaiting[attempt.jobId] = held
            }
            return [.send(peer, .submissionRecorded(attempt))] + dispatch(now: now)
        }
    }

    /// A worker is stopping: no more jobs for it; the prefetched ones it gives back are queued
    /// again at once (fenced in the store like any requeue), and those it runs stay held until
    /// their results come.
    /// The worker hears `leaveNoted` after these actions: nothing is sent to it after that (a
    /// start being written for it meanwhile is queued again when written, see `started`).
    mutating func leaving(_ peer: Peer, returned: [JobAttempt]) -> [Action] {
        guard let worker = workers[peer] else { return [.send(peer, .leaveNoted)] }
        workers[peer]?.leaving = true
        var actions: [Action] = []
        for attempt in returned where worker.holds(attempt.jobId)?.attempt == attempt.attempt {
            workers[peer]?.drop(attempt.jobId)
            progress[attempt.jobId] = nil
            actions.append(.requeue(attempt, reason: "worker \(worker.id) stopped before running it", cause: .returned))
        }
        return actions + [.send(peer, .leaveNoted)]
    }

    mutating func ready(_ ready: WorkerReady, from peer: Peer, now: Instant) -> [Action] {
        let capacity = min(max(ready.capacity, 1), configuration.maxCapacity) + min(max(ready.prefetch ?? 0, 0), configuration.maxCapacity)
        let range = configuration.heartbeatRange
        let heartbeat = ready.heartbeatMilliseconds.map { min(max(.milliseconds($0), range.lowerBound), range.upperBound) } ?? configuration.heartbeat
        let joined = workers[peer] == nil
        var worker = workers[peer] ?? Worker(id: ready.workerId, capacity: capacity, effects: [], heartbeat: heartbeat, lastSeen: now)
        worker.capacity = capacity
        worker.leaving = false
        worker.drained = controls.drainedWorkers.contains(ready.workerId)
        worker.host = ready.host.map { String($0.prefix(255)) }
        worker.version = ready.version.map { String($0.prefix(64)) }
        worker.prefetch = min(max(ready.prefetch ?? 0, 0), configuration.maxCapacity)
        worker.effects = Set(ready.effects)
        worker.heartbeat = heartbeat
        worker.lastSeen = now
        worker.batches = ready.batches == true
        workers[peer] = worker
        var actions: [Action] = joined ? [.workerJoined(id: ready.workerId, capacity: capacity, heartbeat: heartbeat, connected: workers.count)] : []
        if worker.batches { actions.append(.send(peer, .batches)) }
        actions += dispatch(now: now)
        return actions
    }

    /// A result to write. The worker has finished the attempt, so the slot it held goes to the
    /// next job now: its start comes out of the same event, and the owner writes it with the
    /// result (one transaction). The worker's own capacity bounds what it runs; a result whose
    /// write fails takes its slot back until it is sent again.
    mutating func record(_ attempt: JobAttempt, _ result: WorkerResult, from peer: Peer, now: Instant) -> [Action] {
        guard recording.count < configuration.maxRecording, recording.insert(attempt).inserted else { return [] }
        workers[peer]?.finish(attempt)
        return [.record(peer, attempt, result)] + dispatch(now: now)
    }

    /// A worker's heartbeat names the attempts it holds. One assigned to it longer ago than its
    /// deadline that it does not name never reached it (or it forgot it): queued again. Those it
    /// names that nobody holds here (this service restarted meanwhile) are looked up, and taken
    /// back if they are still the jobs' current attempts.
    mutating func heard(_ named: [JobAttempt], from peer: Peer, now: Instant) -> [Action] {
        guard let worker = workers[peer] else { return [] }
        let names = Set(named)
        var actions: [Action] = []
        for (jobId, held) in worker.everything where held.attempt > 0 && held.since.duration(to: now) > worker.deadline {
            let attempt = JobAttempt(jobId: jobId, attempt: held.attempt)
            if !names.contains(attempt), !recording.contains(attempt) {
                workers[peer]?.drop(jobId)
                progress[jobId] = nil
                actions.append(.requeue(attempt, reason: "worker \(worker.id) does not hold the job", cause: .assignmentLost))
            }
        }
        // Its own stranded calls that it does not name: it came back without them (it restarted
        // under the same id), so no one waits on them any more.
        for (jobId, job) in stranded where job.workerId == worker.id && !names.contains(JobAttempt(jobId: jobId, attempt: job.attempt)) {
            stranded[jobId] = nil
            actions.append(.requeue(JobAttempt(jobId: jobId, attempt: job.attempt),
                                    reason: "worker \(worker.id) came back without its generation", cause: .workerLost))
        }
        let unknown = named.filter { holder(of: $0.jobId) == nil }
        if !unknown.isEmpty, !lookingUp.contains(peer) {
            lookingUp.insert(peer)
            actions.append(.lookUp(peer, Array(unknown.prefix(configuration.maxCapacity))))
        }
        return actions
    }

    /// The jobs a worker named that are still processing under the attempts it named: it holds
    /// them now, unless someone else took them meanwhile.
    public mutating func claimed(_ current: [JobAttempt], by peer: Peer, effects: [String: String] = [:], now: Instant) -> [Action] {
        lookingUp.remove(peer)
        for attempt in current where workers[peer] != nil && holder(of: attempt.jobId) == nil {
            stranded[attempt.jobId] = nil
            // In a slot until the worker says again that it waits on a provider.
            let provider = effects[attempt.jobId].flatMap { catalog.provider(of: $0) }
            workers[peer]?.held[attempt.jobId] = Held(attempt: attempt.attempt, since: now, provider: provider)
            unheld[attempt.jobId] = nil
        }
        return []
    }

    // MARK: Events: writes done

    /// The starts were written (or not). After a failed write nothing more is handed out until
    /// the next tick: starting again at once would spin against a database that is failing.
    public mutating func started(_ outcomes: [(Start, StartOutcome)], now: Instant) -> [Action] {
        var actions: [Action] = []
        var failed = false
        for (start, outcome) in outcomes {
            let peer = start.peer, jobId = start.job.jobId
            let held = workers[peer]?.held[jobId]
            switch outcome {
            case .gone:
                workers[peer]?.drop(jobId)
            case .failed:
                workers[peer]?.drop(jobId)
                queue.push(start.job, atFront: true)
                failed = true
            case .started(let job):
                let attempt = JobAttempt(jobId: job.id, attempt: job.attempts)
                guard held != nil, let effect = catalog.effect(job.effectId) else {
                    // The worker was lost meanwhile (or the effect is gone from the catalogue).
                    workers[peer]?.drop(jobId)
                    actions.append(.requeue(attempt, reason: "worker lost before assignment", cause: .workerLost))
                    continue
                }
                if let worker = workers[peer], worker.leaving {
                    // It said it is stopping while this start was written, and has heard that
                    // nothing more comes: the job goes back to the queue, not to a worker gone.
                    workers[peer]?.drop(jobId)
                    actions.append(.requeue(attempt, reason: "worker \(worker.id) stopped before running it", cause: .returned))
                    continue
                }
                workers[peer]?.held[jobId] = Held(attempt: job.attempts, since: now, provider: held?.provider)
                if job.attempts == 1 { actions.append(.firstAssignment(job)) }
                actions.append(.send(peer, .assign(JobAssignment(
                    attempt: attempt, userId: job.userId, imageKey: job.imageKey,
                    effect: effect, parameters: job.parameters, prompt: job.prompt, submission: job.submission, traceParent: job.traceParent,
                    imageETag: job.imageETag
                ))))
                if held?.cancelAfterStart == true { actions.append(.send(peer, .cancel(attempt))) }
            }
        }
        return failed ? actions : actions + dispatch(now: now)
    }

    /// A worker's result was written (or not). The worker hears `recorded` only now, once the
    /// result is durable; until then it holds the attempt and sends the result again.
    public mutating func recorded(_ attempt: JobAttempt, from peer: Peer, outcome: RecordOutcome, now: Instant) -> [Action] {
        recording.remove(attempt)
        if workers[peer]?.held[attempt.jobId]?.attempt == attempt.attempt { workers[peer]?.settle(attempt.jobId) }
        if case .failed = outcome { return [] }
        var since: Instant?
        if let held = workers[peer]?.holds(attempt.jobId), held.attempt == attempt.attempt {
            since = held.since
            workers[peer]?.drop(attempt.jobId)
            progress[attempt.jobId] = nil
        }
        var actions: [Action] = []
        switch outcome {
        case .failed:
            break
        case .applied(let job, let retryAfter):
            actions.append(.finished(job, runningSince: since))
            actions.append(.send(peer, .recorded(attempt)))
            if job.status == .queued { delay(Self.queued(job), until: now.advanced(by: retryAfter ?? .zero)) }
        case .alreadyRecorded:
            actions.append(.send(peer, .recorded(attempt)))
        case .refused(let reason):
            actions.append(.refused(attempt, reason: reason))
            actions.append(.send(peer, .refused(attempt, reason: reason)))
        }
        return actions + dispatch(now: now)
    }

    /// A processing attempt was queued again in the store (`job`: its new state; nil when the
    /// store refused it as stale, or the write failed and the reconcile will try again).
    public mutating func requeued(_ job: JobRecord?, now: Instant) -> [Action] {
        if let job, job.status == .queued { queue.push(Self.queued(job), atFront: true) }
        return dispatch(now: now)
    }

    // MARK: Events: time

    /// Buries dead workers, sends heartbeats when due, releases due retries and dispatches.
    public mutating func tick(now: Instant) -> [Action] {
        var actions: [Action] = []
        for (peer, worker) in workers where worker.lastSeen.duration(to: now) > worker.deadline {
            workers[peer] = nil
            let jobs = worker.held.count + worker.awaiting.count
            actions.append(worker.leaving && jobs == 0
                ? .workerLeft(id: worker.id, connected: workers.count)
                : .workerLost(id: worker.id, jobs: jobs, connected: workers.count))
            let grace = configuration.lostWorkerGrace
            for (jobId, held) in worker.everything where held.attempt > 0 {
                progress[jobId] = nil
                // At a provider: a call in a slot (its provider named), or a generation waiting in
                // the provider's queue (no slot, no provider counted).
                if held.provider != nil || worker.awaiting[jobId] != nil, grace > .zero {
                    stranded[jobId] = Stranded(attempt: held.attempt, workerId: worker.id, provider: held.provider, until: now.advanced(by: grace))
                } else {
                    actions.append(.requeue(JobAttempt(jobId: jobId, attempt: held.attempt), reason: "worker \(worker.id) was lost", cause: .workerLost))
                }
            }
        }
        for (jobId, job) in stranded where job.until <= now {
            stranded[jobId] = nil
            actions.append(.requeue(JobAttempt(jobId: jobId, attempt: job.attempt),
                                    reason: "worker \(job.workerId) was lost and did not come back for its generation", cause: .workerLost))
        }
        if lastHeartbeat.map({ $0.duration(to: now) >= configuration.heartbeat }) ?? true {
            lastHeartbeat = now
            for peer in workers.keys { actions.append(.send(peer, .heartbeat)) }
        }
        while let first = delayed.min, first.due <= now {
            let job = delayed.removeMin().job
            if delayedIds.remove(job.jobId) != nil { queue.push(job) }
        }
        return actions + dispatch(now: now)
    }

    /// Compares the processing jobs in the store with what workers hold: one nobody holds for
    /// `grace` is queued again.
    public mutating func reconcile(processing: [JobAttempt], now: Instant) -> [Action] {
        var actions: [Action] = []
        var seen: Set<String> = []
        let grace = self.grace
        for attempt in processing {
            seen.insert(attempt.jobId)
            let held = holder(of: attempt.jobId).map { $0.attempt == 0 || $0.attempt == attempt.attempt } ?? false
            if held || recording.contains(attempt) || stranded[attempt.jobId]?.attempt == attempt.attempt {
                unheld[attempt.jobId] = nil
                continue
            }
            guard let since = unheld[attempt.jobId] else {
                unheld[attempt.jobId] = now
                continue
            }
            if since.duration(to: now) >= grace {
                unheld[attempt.jobId] = nil
                actions.append(.requeue(attempt, reason: "no worker held the job", cause: .unheld))
            }
        }
        unheld = unheld.filter { seen.contains($0.key) }
        return actions + dispatch(now: now)
    }

    // MARK: Dispatch

    mutating func delay(_ job: QueuedJob, until due: Instant) {
        delayed.insert(Delayed(due: due, job: job))
        delayedIds.insert(job.jobId)
    }

    /// Hands out queued jobs while some worker has a free slot for them: the fair queue's next
    /// job to the worker with the most free slots that runs its effect. Each slot is held while
    /// the start is written; the starts of all jobs handed out at once go in one action.
    mutating func dispatch(now: Instant) -> [Action] {
        guard queue.count > 0 else { return [] }
        var starts: [Start] = []
        var candidates = workers.filter { $0.value.free > 0 }.map { (peer: $0.key, free: $0.value.free) }
        let limits = providerLimits
        let catalog = self.catalog
        let pausedEffects = Set(controls.pausedEffects), pausedProviders = Set(controls.pausedProviders)
        let paused = !pausedEffects.isEmpty || !pausedProviders.isEmpty
        var active = limits.isEmpty ? [:] : activeByProvider()
        while !candidates.isEmpty, queue.count > 0 {
            candidates.sort { $0.free > $1.free }
            var assigned = false
            for (index, candidate) in candidates.enumerated() {
                guard let worker = workers[candidate.peer], let job = queue.pop(where: { job in
                    guard worker.accepts(job) else { return false }
                    if paused, pausedEffects.contains(job.effectId) || pausedProviders.contains(catalog.provider(of: job.effectId) ?? "none") { return false }
                    guard !limits.isEmpty, let provider = catalog.provider(of: job.effectId), let limit = limits[provider] else { return true }
                    return active[provider, default: 0] < limit
                }) else { continue }
                let provider = catalog.provider(of: job.effectId)
                if let provider, !limits.isEmpty { active[provider, default: 0] += 1 }
                workers[candidate.peer]?.held[job.jobId] = Held(attempt: 0, since: now, provider: provider)
                starts.append(Start(peer: candidate.peer, job: job))
                candidates[index].free -= 1
                if candidates[index].free == 0 { candidates.remove(at: index) }
                assigned = true
                break
            }
            if !assigned { break }
        }
        return starts.isEmpty ? [] : [.start(starts)]
    }

    public static func queued(_ job: JobRecord) -> QueuedJob {
        QueuedJob(jobId: job.id, userId: job.userId, isPro: job.isPro, effectId: job.effectId)
    }
}
