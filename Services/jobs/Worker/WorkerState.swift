import DequeModule
import Messages

/// The worker's side of the worker protocol, as a pure state machine: no locks, no sockets, no
/// tasks, no clock of its own (time is passed in). `Worker` is its shell, as `Dispatcher` is
/// `DispatchStateMachine`'s: it feeds in what happens (a message from the jobs service, a job
/// asking for its place, a job ending, a heartbeat's tick) and carries out the actions that come
/// back (send, launch, grant a place, stop a job).
///
/// What it holds:
/// - **held jobs**, by attempt, from their assignment to their end: running, prefetched, or
///   generations waiting on a provider;
/// - **places**: at most `capacity` jobs do their work at once. A held job asks for its place once
///   its input is ready; places go in the order jobs were assigned (the service's), so a job whose
///   input came first does not overtake one assigned before it. A generation waiting in a
///   provider's queue gives its place back (`detach`, at most `maxDetached` at once), and so does
///   an image model's job once its provider answered (`release`, at most `capacity` at once);
/// - **leaving**: stopping, the worker gives back the jobs without a place and the generations
///   waiting on providers, finishes the rest, and waits for `leaveNoted`;
/// - **results not yet recorded**, sent again with every heartbeat and after a reconnect until
///   the service says recorded or refused (past `maxUnrecorded`, the oldest is dropped: the
///   service's reconcile repairs its job);
/// - **provider requests not yet recorded**, sent again with every heartbeat;
/// - **fresh URLs** the service sent (`renewed`) for held jobs;
/// - **the service's silence**: three heartbeats without a message and the worker reconnects.
public struct WorkerState: Sendable {
    /// Where a held job stands with its place.
    public enum Place: Sendable, Equatable {
        /// Its input is not ready yet: it has not asked.
        case waiting
        /// Its input is ready: it waits for a place.
        case asking
        case placed
        /// Its generation waits in a provider's queue: its place went to the next job.
        case detached
        /// Its image model answered: it finishes without a place.
        case released
    }

    struct Held: Sendable {
        var place: Place = .waiting
        /// The service cancelled it.
        var cancelled = false
        /// Given back as the worker stops: it ends without a result.
        var handedOff = false
    }

    /// What the shell does.
    public enum Action: Sendable, Equatable {
        case send(WorkerMessage)
        /// Results to send again, in one message where the service takes batches.
        case resend([WorkerMessage])
        /// Start the job's task.
        case launch(JobAssignment)
        /// Resume the job waiting for its place: it has one.
        case grant(JobAttempt)
        /// Resume the job waiting for its place with a refusal (the worker is leaving, or the job
        /// ended).
        case refusePlace(JobAttempt)
        /// Stop the job's work (its cancel signal).
        case stop(JobAttempt)
        /// Wake the job's poll early: its provider's webhook came.
        case poke(JobAttempt)
        /// Send the process's metrics.
        case sendMetrics
        /// The service takes results in batches from now on.
        case takeBatches
        /// A new connection (or the service forgot this worker): one result a message until it
        /// says `batches`.
        case resetReports
        /// No job is held any more.
        case empty
        /// The service has been silent for three heartbeats: connect again.
        case reconnect
        /// For the log.
        case note(Note)
    }

    /// What the shell logs.
    public enum Note: Sendable, Equatable {
        /// The service answered on this connection for the first time.
        case connected
        /// A running job is being cancelled.
        case cancelling(JobAttempt)
        /// A job cancelled before it had a place: its task ends at once.
        case cancelledBeforeStart(JobAttempt)
        case refused(JobAttempt, reason: String)
        /// Silent for three heartbeats after answering.
        case silent
    }

    public let capacity: Int
    public let maxDetached: Int
    public let heartbeat: Duration
    /// How often metrics go to the service (with the first heartbeat, then this often).
    public let metricsInterval: Duration
    /// What the worker says as it connects (and again when the service forgot it).
    public let ready: WorkerMessage
    public static let maxUnrecorded = 1_024

    private var held: [JobAttempt: Held] = [:]
    /// Held jobs without a place, in the order they were assigned.
    private var unplaced: Deque<JobAttempt> = []
    private var placed = 0, detached = 0, released = 0
    /// The place counts last shown in the gauges (`changedGauges`).
    private var shown = (placed: 0, detached: 0)
    public private(set) var leaving = false
    /// The service answered `leaving` on this connection.
    public private(set) var leaveNoted = false
    public private(set) var unrecorded: [JobAttempt: WorkerMessage] = [:]
    private var submissions: [JobAttempt: (request: ProviderRequest, recorded: Bool)] = [:]
    private var renewed: [JobAttempt: JobTransfer] = [:]
    private var lastHeard: ContinuousClock.Instant
    /// The service has said something on this connection.
    public private(set) var heard = false
    private var metricsSent: ContinuousClock.Instant?

    public init(capacity: Int, maxDetached: Int, heartbeat: Duration, metricsInterval: Duration = .seconds(5),
                ready: WorkerMessage, now: ContinuousClock.Instant) {
        self.capacity = max(1, capacity)
        self.maxDetached = maxDetached
        self.heartbeat = heartbeat
        self.metricsInterval = metricsInterval
        self.ready = ready
        self.lastHeard = now
    }

    // MARK: Queries

    public var heldCount: Int { held.count }
    public var heldAttempts: [JobAttempt] { Array(held.keys) }
    public func holds(_ attempt: JobAttempt) -> Bool { held[attempt] != nil }
    public func place(of attempt: JobAttempt) -> Place? { held[attempt]?.place }
    public func wasCancelled(_ attempt: JobAttempt) -> Bool { held[attempt]?.cancelled == true }
    public func isHandedOff(_ attempt: JobAttempt) -> Bool { held[attempt]?.handedOff == true }
    public func latestTransfer(_ attempt: JobAttempt) -> JobTransfer? { renewed[attempt] }
    /// Stopping can end: every job ended, every result recorded, and the service noted it.
    public var leaveDone: Bool { held.isEmpty && unrecorded.isEmpty && leaveNoted }

    // MARK: The connection

    /// A new connection: `ready`, the results not yet recorded, and every provider request
    /// counted as unrecorded (a restarted service learns them anew).
    public mutating func connected(now: ContinuousClock.Instant) -> [Action] {
        lastHeard = now
        heard = false
        for key in submissions.keys { submissions[key]?.recorded = false }
        return [.resetReports, .send(ready), .resend(Array(unrecorded.values))]
    }

    /// A heartbeat's tick: the heartbeat with every attempt held or unrecorded, the results and
    /// provider requests not yet recorded, the metrics when due; `reconnect` after three
    /// heartbeats of silence.
    public mutating func tick(now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = [
            .send(.heartbeat(running: Array(held.keys) + Array(unrecorded.keys))), .resend(Array(unrecorded.values)),
        ]
        actions += unrecordedSubmissions.map { .send($0) }
        if metricsSent.map({ $0.duration(to: now) >= metricsInterval }) ?? true {
            metricsSent = now
            actions.append(.sendMetrics)
        }
        if lastHeard.duration(to: now) > heartbeat * 3 {
            // (Never answered: the shell's connect loop says so, once.)
            if heard { actions.append(.note(.silent)) }
            actions.append(.reconnect)
        }
        return actions
    }

    private var unrecordedSubmissions: [WorkerMessage] {
        submissions.filter { !$0.value.recorded }.map { .submitted($0.key, $0.value.request) }
    }

    /// A message from the service.
    public mutating func received(_ message: DispatcherMessage, now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = []
        if !heard { actions.append(.note(.connected)) }
        heard = true
        lastHeard = now
        return actions + handle(message)
    }

    private mutating func handle(_ message: DispatcherMessage) -> [Action] {
        switch message {
        case .submissionRecorded(let attempt):
            submissions[attempt]?.recorded = true
        case .poke(let attempt):
            if held[attempt] != nil { return [.poke(attempt)] }
        case .renewed(let attempt, let transfer):
            if held[attempt] != nil { renewed[attempt] = transfer }
        case .heartbeat:
            break
        case .leaveNoted:
            leaveNoted = true
        case .batches:
            return [.takeBatches]
        case .all(let messages):
            return messages.flatMap { message -> [Action] in
                if case .all = message { return [] }
                return handle(message)
            }
        case .reconnect:
            // The service forgot this worker: it must hear all of it again, and answer again.
            var actions: [Action] = [.resetReports, .send(ready)]
            if leaving {
                leaveNoted = false
                actions.append(.send(.leaving(returned: [])))
            }
            actions.append(.resend(Array(unrecorded.values)))
            for key in submissions.keys { submissions[key]?.recorded = false }
            return actions + unrecordedSubmissions.map { .send($0) }
        case .recorded(let attempt):
            unrecorded[attempt] = nil
        case .refused(let attempt, let reason):
            unrecorded[attempt] = nil
            return [.note(.refused(attempt, reason: reason))]
        case .cancel(let attempt):
            guard let job = held[attempt] else { return [] }
            held[attempt]?.cancelled = true
            let started = job.place != .waiting && job.place != .asking
            return [.note(started ? .cancelling(attempt) : .cancelledBeforeStart(attempt)), .stop(attempt)]
        case .assign(let job):
            // Sent before the service heard that this worker is stopping: given back.
            guard !leaving else { return [.send(.leaving(returned: [job.attempt]))] }
            guard held[job.attempt] == nil else { return [] }
            held[job.attempt] = Held()
            unplaced.append(job.attempt)
            return [.launch(job)]
        }
        return []
    }

    // MARK: Places

    /// The job's input is ready: it asks for its place. `grant` for it (now or later), or
    /// `refusePlace` when the worker is leaving; a job that has its place, or gave it on
    /// already, goes on at once.
    public mutating func askPlace(_ attempt: JobAttempt) -> [Action] {
        guard let job = held[attempt] else { return [.refusePlace(attempt)] }
        guard job.place == .waiting || job.place == .asking else { return [.grant(attempt)] }
        guard !leaving else { return [.refusePlace(attempt)] }
        held[attempt]?.place = .asking
        return grants()
    }

    /// The job's task stopped waiting for its place (cancelled): it is refused, and waits again
    /// if it asks again.
    public mutating func withdraw(_ attempt: JobAttempt) -> [Action] {
        guard held[attempt]?.place == .asking else { return [] }
        held[attempt]?.place = .waiting
        return [.refusePlace(attempt)] + grants()
    }

    /// Free places to the first unplaced jobs, as long as they ask.
    private mutating func grants() -> [Action] {
        var actions: [Action] = []
        while !leaving, placed < capacity, let first = unplaced.first, held[first]?.place == .asking {
            unplaced.removeFirst()
            held[first]?.place = .placed
            placed += 1
            actions.append(.grant(first))
        }
        return actions
    }

    /// The job's generation waits in a provider's queue: its place goes to the next job, unless
    /// `maxDetached` wait so already. False if it keeps its place.
    public mutating func detach(_ attempt: JobAttempt) -> (Bool, [Action]) {
        giveBack(attempt, becoming: .detached, unless: detached >= maxDetached)
    }

    /// The job's image model answered: its place goes to the next job, unless `capacity` jobs
    /// finish so already (slow writes then hold the worker back instead of piling up). False if
    /// it keeps its place.
    public mutating func release(_ attempt: JobAttempt) -> (Bool, [Action]) {
        giveBack(attempt, becoming: .released, unless: released >= capacity)
    }

    /// A placed job goes on without its place, which goes to the next job in line.
    private mutating func giveBack(_ attempt: JobAttempt, becoming place: Place, unless full: Bool) -> (Bool, [Action]) {
        guard held[attempt]?.place == .placed, !full else { return (false, []) }
        held[attempt]?.place = place
        placed -= 1
        if place == .detached { detached += 1 } else { released += 1 }
        return (true, grants())
    }

    /// The jobs holding a place and the generations waiting at a provider without one, when
    /// either changed since the last call: what `worker_jobs_in_progress` and
    /// `worker_generations_waiting` show.
    public mutating func changedGauges() -> (placesHeld: Int, generationsWaiting: Int)? {
        guard shown != (placed, detached) else { return nil }
        shown = (placed, detached)
        return (placed, detached)
    }

    // MARK: Jobs ending

    /// A provider request was submitted for the job: sent again with every heartbeat until recorded.
    public mutating func submitted(_ attempt: JobAttempt, _ request: ProviderRequest) {
        submissions[attempt] = (request, false)
    }

    /// The job ended with `result` (nil: handed off, nothing to report): kept until recorded, and
    /// the job no longer held.
    public mutating func ended(_ attempt: JobAttempt, result: WorkerMessage?) -> [Action] {
        if let result {
            if unrecorded.count >= Self.maxUnrecorded, let dropped = unrecorded.keys.first { unrecorded[dropped] = nil }
            unrecorded[attempt] = result
        }
        var actions: [Action] = []
        if let job = held.removeValue(forKey: attempt) {
            switch job.place {
            case .waiting: unplaced.removeAll { $0 == attempt }
            case .asking:
                unplaced.removeAll { $0 == attempt }
                actions.append(.refusePlace(attempt))
            case .placed: placed -= 1
            case .detached: detached -= 1
            case .released: released -= 1
            }
        }
        submissions[attempt] = nil
        renewed[attempt] = nil
        actions += grants()
        if held.isEmpty { actions.append(.empty) }
        return actions
    }

    // MARK: Stopping

    /// Stopping (SIGTERM): no job takes a place any more; the jobs without one and the
    /// generations waiting on providers are given back (their work stops; the service queues
    /// them again, and the next attempt waits on the provider's request). Says `leaving` with them.
    public mutating func leave() -> (returned: [JobAttempt], actions: [Action]) {
        leaving = true
        var actions: [Action] = []
        var returned: [JobAttempt] = []
        for attempt in unplaced {
            if held[attempt]?.place == .asking { actions.append(.refusePlace(attempt)) }
        }
        returned = Array(unplaced) + held.filter { $0.value.place == .detached }.map(\.key)
        for attempt in returned {
            held[attempt]?.handedOff = true
            actions.append(.stop(attempt))
        }
        return (returned, [.send(.leaving(returned: returned))] + actions)
    }

    /// Stopping without the service (it fell silent while the worker was leaving): every job
    /// still held is handed back, as a lost connection hands it back.
    public mutating func handBackAll() -> [Action] {
        held.keys.map { attempt in
            held[attempt]?.handedOff = true
            return .stop(attempt)
        }
    }
}
