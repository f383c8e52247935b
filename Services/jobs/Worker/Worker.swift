import Blobs
import Bus
import DequeModule
import Foundation
import Logging
import Metrics
import Messages
import ServiceKit
import ServiceLifecycle
import Synchronization
import Tracing

/// A worker process's loop (Paranoid Pirate): connect to the jobs service, say `ready`, run what
/// is assigned (at most `capacity` at once), send heartbeats, progress and results; if the service
/// is silent for three heartbeat intervals, reconnect and say `ready` again. A result is sent
/// again with every heartbeat, across reconnects, until the service answers that it is recorded
/// (or refused): a result lost on the way, or one the service could not write, is never lost.
public struct Worker: Service {
    let configuration: WorkerConfiguration
    let runner: EffectRunner
    let effects: [String]
    let logger: Logger

    public init(configuration: WorkerConfiguration, runner: EffectRunner, effects: [String], logger: Logger) {
        self.configuration = configuration
        self.runner = runner
        self.effects = effects
        self.logger = logger
    }

    /// A job's cancel, asked from outside the task that runs it: `fire()` wakes `wait()`, which
    /// the job's task group turns into the cancellation of the job's work.
    final class CancelSignal: Sendable {
        private let state = Mutex<(fired: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

        func fire() {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.fired = true
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }

        /// Returns once fired, or once the waiting task is cancelled.
        func wait() async {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
                    let fired = state.withLock { state -> Bool in
                        if !state.fired { state.waiter = waiter }
                        return state.fired
                    }
                    if fired { waiter.resume() }
                }
            } onCancel: {
                fire()
            }
        }
    }

    /// A job to start, on the connection it came by.
    struct Launch: Sendable {
        let job: JobAssignment
        let channel: BusChannel
    }

    /// Jobs held now, by attempt: those running and those prefetched. Each held job runs in a task
    /// of its own (of `Worker.run`'s group, through `launches`) from the moment it is assigned:
    /// it fetches and checks its input, then waits for one of the `capacity` places
    /// (`takePlace`) for its work. So a prefetched job's download is done by the time a place
    /// frees, and a place is spent on the work, not on moving the input.
    final class Running: Sendable {
        let capacity: Int
        /// Attempts held, each with the signal that cancels it.
        private let tasks = Mutex<[JobAttempt: CancelSignal]>([:])
        /// Attempts the service cancelled (not those handed off as the worker stops).
        private let cancelled = Mutex<Set<JobAttempt>>([])
        /// Jobs to start. Unbounded, but it never holds more than the jobs held (`capacity` plus
        /// the prefetched and the generations waiting on providers).
        let launches: AsyncStream<Launch>
        private let launchInput: AsyncStream<Launch>.Continuation

        struct Places {
            /// Attempts in a place now: at most `capacity`.
            var placed: Set<JobAttempt> = []
            /// Held attempts that have not had a place yet, in the order they were assigned:
            /// places go in this order (the service's), so a job whose input came first does not
            /// overtake one assigned before it.
            var unplaced: Deque<JobAttempt> = []
            /// Those of them asking for a place (their input ready), each resumed when it has one
            /// (or thrown out).
            var asking: [JobAttempt: CheckedContinuation<Void, any Error>] = [:]
            /// The worker is stopping: no job takes a place any more.
            var leaving = false

            /// Gives free places to the first unplaced jobs, as long as they are asking; returns
            /// those to resume.
            mutating func grant(capacity: Int) -> [CheckedContinuation<Void, any Error>] {
                var granted: [CheckedContinuation<Void, any Error>] = []
                while !leaving, placed.count < capacity, let first = unplaced.first, let waiter = asking.removeValue(forKey: first) {
                    unplaced.removeFirst()
                    placed.insert(first)
                    granted.append(waiter)
                }
                return granted
            }
        }
        private let places = Mutex(Places())
        /// Attempts whose generations wait in a provider's queue: they gave their place back.
        private let detached = Mutex<Set<JobAttempt>>([])
        /// The most of those at once; past it a generation keeps its place while it waits.
        let maxDetached: Int

        init(capacity: Int, maxDetached: Int = 2000) {
            self.capacity = capacity
            self.maxDetached = maxDetached
            (launches, launchInput) = AsyncStream.makeStream(of: Launch.self)
        }

        /// Starts `job` in a task of the worker's group.
        func launch(_ job: JobAssignment, on channel: BusChannel) { launchInput.yield(Launch(job: job, channel: channel)) }
        /// No more jobs start: the worker's group waits for those running, then `run` returns.
        func endLaunches() { launchInput.finish() }
        /// The signal that cancels `attempt`, while it is held.
        func cancelSignal(_ attempt: JobAttempt) -> CancelSignal? { tasks.withLock { $0[attempt] } }

        /// Returns once `attempt` has one of the places: when one is free and every job assigned
        /// before it has one. Throws if the job is cancelled meanwhile or handed back as the
        /// worker stops. A job that gave its place on already (and asks again only as it tries
        /// its work again, waiting for disk space) goes on at once.
        func takePlace(_ attempt: JobAttempt) async throws {
            let capacity = capacity
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    // Whoever takes the continuation out of `asking` resumes it, once: a freed
                    // place (`grant`), the worker stopping (`leave`) or the task's cancellation.
                    enum Now { case taken, refused, asked([CheckedContinuation<Void, any Error>]) }
                    let now = places.withLock { places -> Now in
                        guard places.unplaced.contains(attempt) else { return .taken }
                        if Task.isCancelled || places.leaving { return .refused }
                        places.asking[attempt] = continuation
                        return .asked(places.grant(capacity: capacity))
                    }
                    switch now {
                    case .taken: continuation.resume()
                    case .refused: continuation.resume(throwing: CancellationError())
                    case .asked(let granted): for waiter in granted { waiter.resume() }
                    }
                }
            } onCancel: {
                let waiter = places.withLock { $0.asking.removeValue(forKey: attempt) }
                waiter?.resume(throwing: CancellationError())
            }
        }

        /// `attempt` no longer needs its place (if it has one), or it ended without one: the
        /// next jobs in line that ask get the places free.
        private func leavePlace(_ attempt: JobAttempt) {
            let (granted, orphan) = places.withLock { places -> ([CheckedContinuation<Void, any Error>], CheckedContinuation<Void, any Error>?) in
                places.placed.remove(attempt)
                if let index = places.unplaced.firstIndex(of: attempt) { places.unplaced.remove(at: index) }
                let orphan = places.asking.removeValue(forKey: attempt)
                return (places.grant(capacity: capacity), orphan)
            }
            orphan?.resume(throwing: CancellationError())
            for waiter in granted { waiter.resume() }
        }

        /// The attempt waits on a provider now: its place goes to the next job, unless
        /// `maxDetached` wait so already. False if it keeps its place.
        func detach(_ attempt: JobAttempt) -> Bool {
            let detached = self.detached.withLock { set -> Bool in
                guard !set.contains(attempt), set.count < maxDetached, places.withLock({ $0.placed.contains(attempt) }) else { return false }
                set.insert(attempt)
                return true
            }
            if detached { leavePlace(attempt) }
            return detached
        }

        /// Attempts of image models whose providers answered: they finish (check, thumbnail,
        /// store) without a place, which went to the next job. Unlike a detached generation, a
        /// stopping worker finishes them. At most `capacity` at once: past that a job keeps its
        /// place to the end, so slow writes hold the worker back instead of piling up.
        private let released = Mutex<Set<JobAttempt>>([])

        /// The attempt's provider answered: its place goes to the next job. Once per attempt;
        /// false if it keeps its place.
        func release(_ attempt: JobAttempt) -> Bool {
            let first = released.withLock { set -> Bool in
                guard set.count < capacity, !set.contains(attempt), places.withLock({ $0.placed.contains(attempt) }) else { return false }
                set.insert(attempt)
                return true
            }
            if first { leavePlace(attempt) }
            return first
        }

        var attempts: [JobAttempt] { tasks.withLock { Array($0.keys) } }
        var count: Int { tasks.withLock { $0.count } }
        /// Holds `attempt` (assigned, to be launched): a task that ends at once (and removes it)
        /// must find it there, or the attempt would be held for ever.
        func hold(_ attempt: JobAttempt) {
            tasks.withLock { $0[attempt] = CancelSignal() }
            places.withLock { $0.unplaced.append(attempt) }
        }
        var isLeaving: Bool { places.withLock { $0.leaving } }
        /// Whether the service answered `leaving` (on this connection): no job comes after that.
        private let leaveNoted = Mutex(false)
        var isLeaveNoted: Bool {
            get { leaveNoted.withLock { $0 } }
            set { leaveNoted.withLock { $0 = newValue } }
        }
        /// The worker is stopping: the held jobs that have not had a place are given back (their
        /// tasks stop, and end without a result), and so are the generations waiting on a
        /// provider (their tasks stop without cancelling the provider's request, which the job's
        /// next attempt, on another worker, waits on). Returns their attempts.
        func leave() -> [JobAttempt] {
            let (unplaced, asking) = places.withLock { places -> ([JobAttempt], [CheckedContinuation<Void, any Error>]) in
                places.leaving = true
                defer { places.asking.removeAll() }
                return (Array(places.unplaced), Array(places.asking.values))
            }
            let handed = unplaced + detached.withLock { Array($0) }
            handedOff.withLock { $0.formUnion(handed) }
            for waiter in asking { waiter.resume(throwing: CancellationError()) }
            for attempt in handed { cancelSignal(attempt)?.fire() }
            return handed
        }

        /// Jobs given back as the worker stops: they end without a result.
        private let handedOff = Mutex<Set<JobAttempt>>([])
        func isHandedOff(_ attempt: JobAttempt) -> Bool { handedOff.withLock { $0.contains(attempt) } }
        /// The attempt ended: it is no longer held, and its place, if it still had one, goes to
        /// the next job.
        func remove(_ attempt: JobAttempt) {
            leavePlace(attempt)
            let empty = tasks.withLock { tasks in
                _ = tasks.removeValue(forKey: attempt)
                return tasks.isEmpty
            }
            cancelled.withLock { _ = $0.remove(attempt) }
            detached.withLock { _ = $0.remove(attempt) }
            released.withLock { _ = $0.remove(attempt) }
            handedOff.withLock { _ = $0.remove(attempt) }
            if empty { wakeEmptyWaiters() }
        }

        /// Those waiting for the worker to hold no job (`untilEmpty`), by a number of their own.
        private let emptyWaiters = Mutex<(next: Int, waiting: [Int: CheckedContinuation<Void, Never>])>((0, [:]))

        /// Returns once no job is held, or the task is cancelled: woken by the last `remove`, not
        /// by polling. (A waiter is listed before it looks, so a removal between the two cannot
        /// be missed; whoever takes a waiter off the list resumes it, once.)
        func untilEmpty() async {
            let number = emptyWaiters.withLock { waiters in
                defer { waiters.next += 1 }
                return waiters.next
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
                    let now = emptyWaiters.withLock { waiters -> Bool in
                        // Cancelled before it was listed: it is not listed.
                        if Task.isCancelled { return true }
                        waiters.waiting[number] = waiter
                        return false
                    }
                    if now { waiter.resume() } else if tasks.withLock({ $0.isEmpty }) { wakeEmptyWaiters() }
                }
            } onCancel: {
                emptyWaiters.withLock { $0.waiting.removeValue(forKey: number) }?.resume()
            }
        }

        private func wakeEmptyWaiters() {
            for waiter in emptyWaiters.withLock({ waiters -> [CheckedContinuation<Void, Never>] in
                defer { waiters.waiting.removeAll() }
                return Array(waiters.waiting.values)
            }) { waiter.resume() }
        }

        /// The worker stops without the jobs service (it fell silent while the worker was
        /// leaving): every job still held is handed back, as a lost connection hands it back.
        /// Their tasks stop and end without a result; the service queues them again when it
        /// finds the worker gone, or, restarted, finds them held by no one. Returns how many.
        func handBackAll() -> Int {
            let held = attempts
            handedOff.withLock { $0.formUnion(held) }
            for attempt in held { cancelSignal(attempt)?.fire() }
            return held.count
        }
        func contains(_ attempt: JobAttempt) -> Bool { tasks.withLock { $0.index(forKey: attempt) != nil } }

        enum Cancel { case notHeld, running, waiting }
        /// Cancels `attempt` through its task, which ends with the cancel as its result; `waiting`
        /// if it had not had a place yet.
        func cancel(_ attempt: JobAttempt) -> Cancel {
            guard let signal = cancelSignal(attempt) else { return .notHeld }
            let waiting = places.withLock { $0.unplaced.contains(attempt) }
            cancelled.withLock { _ = $0.insert(attempt) }
            signal.fire()
            return waiting ? .waiting : .running
        }
        func wasCancelled(_ attempt: JobAttempt) -> Bool { cancelled.withLock { $0.contains(attempt) } }
    }

    /// Results sent and not yet recorded by the jobs service, by attempt. The service holds a
    /// worker's slot until its result is recorded, so there are about `capacity` of them; past
    /// `Self.maxUnrecorded` one is dropped (its job is then repaired by the service's reconcile).
    final class Unrecorded: Sendable {
        static let maxUnrecorded = 1_024
        private let results = Mutex<[JobAttempt: WorkerMessage]>([:])
        /// How they go out.
        let reports = Reports()

        func keep(_ attempt: JobAttempt, _ result: WorkerMessage) {
            results.withLock { results in
                if results.count >= Self.maxUnrecorded, let dropped = results.keys.first { results[dropped] = nil }
                results[attempt] = result
            }
        }
        func recorded(_ attempt: JobAttempt) { results.withLock { _ = $0.removeValue(forKey: attempt) } }
        var all: [JobAttempt: WorkerMessage] { results.withLock { $0 } }
    }

    /// How results go out. To a service that takes batches (it answered `ready` with `batches`),
    /// results that end together go in one message (`all`): the first to end yields once, so that
    /// those ending with it join, then sends what has gathered. To one that does not, each at once.
    final class Reports: Sendable {
        private struct State {
            /// The service of this connection takes `all`.
            var batches = false
            var pending: [WorkerMessage] = []
            /// Someone is about to send `pending`.
            var gathering = false
        }
        private let state = Mutex(State())

        /// A new connection: one message at a time until its service says `batches`.
        func connected() { state.withLock { $0 = State() } }
        func takeBatches() { state.withLock { $0.batches = true } }

        /// Sends a result now, or with the others ending with it (after a yield).
        func send(_ result: WorkerMessage, on channel: BusChannel) async {
            switch add(result) {
            case .now: channel.send(result)
            case .gather:
                await Task.yield()
                flush(on: channel)
            case .joined: break
            }
        }

        /// Sends a result without waiting (from a context that cannot): with any gathered.
        func sendNow(_ result: WorkerMessage, on channel: BusChannel) {
            switch add(result) {
            case .now: channel.send(result)
            case .gather: flush(on: channel)
            case .joined: break
            }
        }

        /// Sends results again (a heartbeat's, a reconnect's): in one message where the service
        /// takes batches.
        func resend(_ results: [WorkerMessage], on channel: BusChannel) {
            Self.send(results, batches: state.withLock { $0.batches }, on: channel)
        }

        private enum Added { case now, gather, joined }

        private func add(_ result: WorkerMessage) -> Added {
            state.withLock { state in
                guard state.batches else { return .now }
                state.pending.append(result)
                if state.gathering { return .joined }
                state.gathering = true
                return .gather
            }
        }

        private func flush(on channel: BusChannel) {
            let (results, batches) = state.withLock { state in
                defer { state.pending = []; state.gathering = false }
                return (state.pending, state.batches)
            }
            Self.send(results, batches: batches, on: channel)
        }

        /// About the most bytes of results in one message (the service takes messages up to
        /// 1 MiB; an error's text is the only part of a result of any length).
        static let maxBatchBytes = 256 << 10

        private static func send(_ results: [WorkerMessage], batches: Bool, on channel: BusChannel) {
            guard batches, results.count > 1 else {
                for result in results { channel.send(result) }
                return
            }
            var batch: [WorkerMessage] = []
            var bytes = 0
            func flush() {
                if batch.count == 1 { channel.send(batch[0]) } else if !batch.isEmpty { channel.send(WorkerMessage.all(batch)) }
                batch = []
                bytes = 0
            }
            for result in results {
                let size = approximateSize(result)
                if !batch.isEmpty, batch.count == workerProtocolMaxBatch || bytes + size > maxBatchBytes { flush() }
                batch.append(result)
                bytes += size
            }
            flush()
        }

        /// A result's size on the wire, from above: its strings plus an allowance for the rest.
        static func approximateSize(_ result: WorkerMessage) -> Int {
            switch result {
            case .done(let attempt, let output): 256 + attempt.jobId.utf8.count + output.resultKey.utf8.count + output.thumbnailKey.utf8.count
            case .failed(let attempt, let error, _): 256 + attempt.jobId.utf8.count + error.utf8.count
            default: 1024
            }
        }
    }

    /// Fresh URLs the jobs service sent for attempts held here (`renewed`), kept until the
    /// attempt ends.
    final class Renewed: Sendable {
        private let transfers = Mutex<[JobAttempt: JobTransfer]>([:])
        func deliver(_ attempt: JobAttempt, _ transfer: JobTransfer, held: Bool) {
            guard held else { return }
            transfers.withLock { $0[attempt] = transfer }
        }
        func latest(_ attempt: JobAttempt) -> JobTransfer? { transfers.withLock { $0[attempt] } }
        func forget(_ attempt: JobAttempt) { _ = transfers.withLock { $0.removeValue(forKey: attempt) } }
    }

    /// Provider requests the jobs service has not yet said it recorded, sent again with every
    /// heartbeat; all of them again after a reconnect (a restarted service learns them anew).
    final class Submissions: Sendable {
        private let requests = Mutex<[JobAttempt: (request: ProviderRequest, recorded: Bool)]>([:])
        func submitted(_ attempt: JobAttempt, _ request: ProviderRequest) { requests.withLock { $0[attempt] = (request, false) } }
        func recorded(_ attempt: JobAttempt) { requests.withLock { $0[attempt]?.recorded = true } }
        func forget(_ attempt: JobAttempt) { _ = requests.withLock { $0.removeValue(forKey: attempt) } }
        /// Those not recorded, as messages.
        var unrecorded: [WorkerMessage] { requests.withLock { $0.filter { !$0.value.recorded }.map { .submitted($0.key, $0.value.request) } } }
        /// After a reconnect: none is known to be recorded.
        func resetAll() { requests.withLock { for key in $0.keys { $0[key]?.recorded = false } } }
    }

    /// Wakes a generation's poll early when the provider's webhook came (`poke`).
    final class Pokes: Sendable {
        private struct State {
            var waiting: [JobAttempt: CheckedContinuation<Void, Never>] = [:]
            /// Pokes that came while the attempt was not waiting: its next wait returns at once.
            var pending: Set<JobAttempt> = []
        }
        private let state = Mutex(State())

        func poke(_ attempt: JobAttempt, held: Bool) {
            let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
                if let continuation = state.waiting.removeValue(forKey: attempt) { return continuation }
                if held { state.pending.insert(attempt) }
                return nil
            }
            continuation?.resume()
        }

        func forget(_ attempt: JobAttempt) {
            let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.pending.remove(attempt)
                return state.waiting.removeValue(forKey: attempt)
            }
            continuation?.resume()
        }

        /// Waits `interval`, or less if poked meanwhile (or before). Throws if cancelled.
        func wait(_ attempt: JobAttempt, _ interval: Duration) async throws {
            if state.withLock({ $0.pending.remove(attempt) != nil }) { return }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { try? await Task.sleep(for: interval) }
                group.addTask { await self.poked(attempt) }
                await group.next()
                group.cancelAll()
                // The poke's wait ends when cancelled; the sleep ends at once too.
                self.forget(attempt)
            }
            try Task.checkCancellation()
        }

        private func poked(_ attempt: JobAttempt) async {
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let resumeNow = state.withLock { state -> Bool in
                        if Task.isCancelled || state.pending.remove(attempt) != nil { return true }
                        state.waiting[attempt] = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                let continuation = state.withLock { $0.waiting.removeValue(forKey: attempt) }
                continuation?.resume()
            }
        }
    }

    /// URLs closer than this to their expiry are renewed before use (a store checks a URL when
    /// a request starts, so a transfer begun in time completes).
    static let renewalMargin: TimeInterval = 2

    /// When the jobs service was last heard from.
    final class LastHeard: Sendable {
        private let state = Mutex((instant: ContinuousClock.now, heard: false))
        /// Records a message from the service; true for the first on this connection.
        func touch() -> Bool {
            state.withLock { state in
                defer { state = (.now, true) }
                return !state.heard
            }
        }
        var silence: Duration { state.withLock { $0.instant }.duration(to: .now) }
        /// Whether the service has said anything on this connection.
        var heard: Bool { state.withLock { $0.heard } }
    }

    /// How often the worker sends its metrics to the jobs service.
    static let metricsInterval = Duration.seconds(5)

    public func run() async throws {
        WorkerMetrics.inProgress.set(0)
        let running = Running(capacity: configuration.capacity, maxDetached: runner.providers.maxGenerations)
        let unrecorded = Unrecorded()
        let renewed = Renewed()
        let generations = Generations(submissions: Submissions(), pokes: Pokes())
        try await withThrowingDiscardingTaskGroup { jobs in
            jobs.addTask {
                defer {
                    // Stopped with jobs still held: the service fell silent while the worker was
                    // leaving (a Ctrl-C stops the whole stack), so no one waits for their results.
                    let handedBack = running.handBackAll()
                    if handedBack > 0 { logger.info("stopping without the jobs service; jobs handed back", metadata: ["jobs": "\(handedBack)"]) }
                    running.endLaunches()
                }
                try await connect(running: running, unrecorded: unrecorded, renewed: renewed, generations: generations)
            }
            // Each job runs in a task of this group: cancelled with it, and waited for before the
            // process exits.
            for await launch in running.launches {
                jobs.addTask {
                    await runJob(launch.job, channel: launch.channel, running: running, unrecorded: unrecorded, renewed: renewed, generations: generations)
                }
            }
        }
    }

    /// Connects, and connects again whenever the service falls silent, until the worker stops.
    /// "connected" is logged once the service has answered, not when the socket connects: a worker
    /// with the wrong keys connects its socket and is never answered. A service that never answers
    /// is logged once (then at debug) until it does; the refusal's reason, when libzmq knows it, is
    /// the channel's line (`BusChannel`).
    private func connect(running: Running, unrecorded: Unrecorded, renewed: Renewed, generations: Generations) async throws {
        var unansweredLogged = false
        let handshakeFailures = HandshakeFailures()
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let channel = BusChannel.connecting(
                configuration.endpoint, curve: configuration.curve, encoding: configuration.busEncoding, logger: logger, handshakeFailures: handshakeFailures
            )
            let lastHeard = LastHeard()
            defer {
                if lastHeard.heard {
                    unansweredLogged = false
                } else if !Task.isCancelled && !Task.isShuttingDownGracefully {
                    let metadata: Logger.Metadata = [
                        "endpoint": "\(configuration.endpoint)",
                        "check": "the endpoint is reachable from this host; BUS_CURVE_PUBLIC is the services' public key; this worker's key is listed as a worker in jobs' BUS_CURVE_CLIENTS",
                    ]
                    if unansweredLogged {
                        logger.debug("the jobs service still does not answer; trying again", metadata: metadata)
                    } else {
                        logger.warning("the jobs service does not answer; trying again", metadata: metadata)
                        unansweredLogged = true
                    }
                }
            }
            try await channel.running {
                let ready = WorkerMessage.ready(WorkerReady(
                    workerId: configuration.workerId, capacity: configuration.capacity, effects: effects,
                    heartbeatMilliseconds: Int(configuration.heartbeat.wholeMilliseconds), prefetch: configuration.prefetch, batches: true
                ))
                unrecorded.reports.connected()
                channel.send(ready)
                unrecorded.reports.resend(Array(unrecorded.all.values), on: channel)
                generations.submissions.resetAll()
                logger.debug("ready sent", metadata: ["endpoint": "\(configuration.endpoint)"])
                await withTaskGroup(of: Void.self) { group in
                    group.addTask {
                        for await message in channel.incoming {
                            if lastHeard.touch() {
                                logger.info("connected", metadata: [
                                    "endpoint": "\(configuration.endpoint)", "capacity": "\(configuration.capacity)", "prefetch": "\(configuration.prefetch)",
                                ])
                            }
                            guard let decoded = BusChannel.decode(DispatcherMessage.self, message) else { continue }
                            handle(decoded, channel: channel, running: running, unrecorded: unrecorded, renewed: renewed, generations: generations, ready: ready)
                        }
                    }
                    group.addTask {
                        // Heartbeats out; silence in means the service is gone: reconnect.
                        // Metrics go to the service with the first heartbeat and every 5 s.
                        var metricsSent: ContinuousClock.Instant?
                        while !Task.isCancelled {
                            try? await Task.sleep(for: configuration.heartbeat)
                            let results = unrecorded.all
                            channel.send(WorkerMessage.heartbeat(running: running.attempts + results.keys))
                            unrecorded.reports.resend(Array(results.values), on: channel)
                            for submitted in generations.submissions.unrecorded { channel.send(submitted) }
                            if metricsSent.map({ $0.duration(to: .now) >= Self.metricsInterval }) ?? true {
                                metricsSent = .now
                                channel.send(WorkerMessage.metrics(ProcessMetrics.exposition()))
                            }
                            if lastHeard.silence > configuration.heartbeat * 3 {
                                // (Never answered: the connect loop says so, once.)
                                if lastHeard.heard { logger.warning("jobs service silent; reconnecting") }
                                return
                            }
                        }
                    }
                    group.addTask {
                        // Stopping (SIGTERM): leave, then close this connection.
                        guard (try? await gracefulShutdown()) != nil else { return }
                        await leave(channel: channel, running: running, unrecorded: unrecorded)
                    }
                    await group.next()
                    group.cancelAll()
                }
            }
        }
    }

    private func handle(_ message: DispatcherMessage, channel: BusChannel, running: Running, unrecorded: Unrecorded, renewed: Renewed,
                        generations: Generations, ready: WorkerMessage) {
        switch message {
        case .submissionRecorded(let attempt):
            generations.submissions.recorded(attempt)
        case .poke(let attempt):
            generations.pokes.poke(attempt, held: running.contains(attempt))
        case .renewed(let attempt, let transfer):
            renewed.deliver(attempt, transfer, held: running.contains(attempt))
        case .heartbeat:
            break
        case .leaveNoted:
            running.isLeaveNoted = true
        case .batches:
            unrecorded.reports.takeBatches()
        case .all(let messages):
            for message in messages {
                if case .all = message { continue }
                handle(message, channel: channel, running: running, unrecorded: unrecorded, renewed: renewed, generations: generations, ready: ready)
            }
        case .reconnect:
            unrecorded.reports.connected()
            channel.send(ready)
            if running.isLeaving {
                // A service that forgot this worker must hear it again, and answer again.
                running.isLeaveNoted = false
                channel.send(WorkerMessage.leaving(returned: []))
            }
            unrecorded.reports.resend(Array(unrecorded.all.values), on: channel)
            generations.submissions.resetAll()
            for submitted in generations.submissions.unrecorded { channel.send(submitted) }
        case .recorded(let attempt):
            unrecorded.recorded(attempt)
        case .refused(let attempt, let reason):
            unrecorded.recorded(attempt)
            logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
        case .cancel(let attempt):
            switch running.cancel(attempt) {
            case .notHeld:
                break
            case .running:
                logger.info("cancelling", metadata: ["job": "\(attempt.jobId)"])
            case .waiting:
                // Its task ends at once, with the cancel as its result.
                logger.info("cancelled before it started", metadata: ["job": "\(attempt.jobId)"])
            }
        case .assign(let job):
            guard !running.isLeaving else {
                // Sent before the service heard that this worker is stopping: given back.
                channel.send(WorkerMessage.leaving(returned: [job.attempt]))
                return
            }
            guard !running.contains(job.attempt) else { return }
            running.hold(job.attempt)
            running.launch(job, on: channel)
        }
    }

    /// Stopping (SIGTERM): tells the service to send no more jobs, gives back the prefetched ones
    /// that have not started, finishes the running ones and waits for their results to be
    /// recorded and for the service's `leaveNoted` (at most three heartbeat intervals after the
    /// last one ends), so that a worker scaled down loses no work and leaves no job waiting for
    /// it to be declared dead. Jobs assigned before the service heard `leaving` arrive before its
    /// answer, and are given back as they come (`handle`). A service that falls silent meanwhile
    /// (three heartbeats: the whole stack is stopping) ends the wait: the worker stops, and the
    /// jobs it still holds are handed back (`run`), as a lost connection hands them back.
    private func leave(channel: BusChannel, running: Running, unrecorded: Unrecorded) async {
        let returned = running.leave()
        channel.send(WorkerMessage.leaving(returned: returned))
        logger.info("stopping", metadata: ["running": "\(running.count)", "given-back": "\(returned.count)"])
        await running.untilEmpty()
        let deadline = ContinuousClock.now.advanced(by: configuration.heartbeat * 3)
        // (Cancelled: the service fell silent meanwhile, and the worker stops without it.)
        while !Task.isCancelled, !unrecorded.all.isEmpty || !running.isLeaveNoted, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        if !running.isLeaveNoted { logger.warning("stopping without the jobs service's answer; jobs sent meanwhile wait to be declared lost") }
    }

    /// A worker's long generations: provider requests to report, and webhook pokes.
    struct Generations: Sendable {
        let submissions: Submissions
        let pokes: Pokes
    }

    /// Runs a job (in its own task of `run`'s group, from its assignment): it takes a place once
    /// its input is ready (`place`), and gives it to the next job when it ends, or earlier when
    /// its image model answered or its generation waits in a provider's queue. A cancel
    /// (`Running.cancel`, or the hand-off as the worker stops) fires the job's signal, which
    /// cancels its work.
    private func runJob(_ job: JobAssignment, channel: BusChannel, running: Running, unrecorded: Unrecorded, renewed: Renewed, generations: Generations) async {
        let attempt = job.attempt
        let placed = PlaceClock()
        let hooks = EffectRunner.GenerationHooks(
            submitted: { request in
                generations.submissions.submitted(attempt, request)
                channel.send(WorkerMessage.submitted(attempt, request))
                _ = running.detach(attempt)
            },
            wait: { interval in try await generations.pokes.wait(attempt, interval) },
            handedOff: { running.isHandedOff(attempt) },
            answered: {
                if running.release(attempt) { channel.send(WorkerMessage.answered(attempt)) }
            },
            place: {
                try await running.takePlace(attempt)
                placed.start()
            }
        )
        let signal = running.cancelSignal(attempt)
        // The run joins the job's trace (its dispatch); the provider's and the store's HTTP calls
        // made inside it are its children.
        let result = await BusTracing.span("worker.run", continuing: job.traceParent, ofKind: .consumer, attributes: [
            "photoedit.job.id": attempt.jobId, "photoedit.job.attempt": "\(attempt.attempt)", "photoedit.effect": job.effect.id,
        ]) {
            await executeUnlessCancelled(job, signal: signal, channel: channel, running: running, renewed: renewed, hooks: hooks)
        }
        placed.end(job.effect.id, result)
        renewed.forget(attempt)
        generations.submissions.forget(attempt)
        generations.pokes.forget(attempt)
        if running.isHandedOff(attempt) {
            // Given back as the worker stops: the service queued it again already.
            running.remove(attempt)
            return
        }
        await finish(attempt, with: result, channel: channel, running: running, unrecorded: unrecorded)
    }

    /// Runs the attempt until it ends or its cancel signal comes, whichever is first; the other
    /// is cancelled (the job's work by its signal, the signal's wait by the job's end).
    private func executeUnlessCancelled(
        _ job: JobAssignment, signal: CancelSignal?, channel: BusChannel, running: Running, renewed: Renewed, hooks: EffectRunner.GenerationHooks
    ) async -> WorkerMessage {
        await withTaskGroup(of: WorkerMessage?.self) { group in
            group.addTask { await execute(job, channel: channel, running: running, renewed: renewed, hooks: hooks) }
            group.addTask {
                await signal?.wait()
                return nil
            }
            var result = WorkerMessage.cancelled(job.attempt)
            for await outcome in group {
                if let outcome { result = outcome }
                group.cancelAll()
            }
            return result
        }
    }

    /// Sends an attempt's result (with others ending at once, to a service that takes batches),
    /// kept until the service says it is recorded.
    private func finish(_ attempt: JobAttempt, with result: WorkerMessage, channel: BusChannel, running: Running, unrecorded: Unrecorded) async {
        // Kept before it is sent, so a `recorded` that comes at once finds it.
        unrecorded.keep(attempt, result)
        running.remove(attempt)
        await unrecorded.reports.send(result, on: channel)
    }

    /// Runs one attempt and returns its result message. While the disk is full the attempt
    /// waits for space (up to `storageWait`) instead of failing: a full disk is the operator's
    /// to fix, not a reason to use up the job's attempts.
    private func execute(_ job: JobAssignment, channel: BusChannel, running: Running, renewed: Renewed, hooks: EffectRunner.GenerationHooks) async -> WorkerMessage {
        var jobLogger = logger
        jobLogger[metadataKey: "job"] = "\(job.attempt.jobId)"
        jobLogger[metadataKey: "attempt"] = "\(job.attempt.attempt)"
        jobLogger.debug("started", metadata: ["effect": "\(job.effect.id)"])
        return await attempt(job, channel: channel, running: running, renewed: renewed, hooks: hooks, logger: jobLogger, started: .now)
    }

    private func attempt(_ job: JobAssignment, channel: BusChannel, running: Running, renewed: Renewed, hooks: EffectRunner.GenerationHooks,
                         logger jobLogger: Logger, started: ContinuousClock.Instant) async -> WorkerMessage {
        var pause = Duration.seconds(1)
        let heartbeat = configuration.heartbeat
        while true {
            do {
                let output = try await runner.run(job, transfer: {
                    try await Self.fresh(job, channel: channel, renewed: renewed, wait: max(.seconds(5), heartbeat * 5))
                }, hooks: hooks) { fraction in
                    channel.send(WorkerMessage.progress(job.attempt, fraction: fraction))
                }
                if running.wasCancelled(job.attempt) {
                    jobLogger.info("cancelled")
                    return .cancelled(job.attempt)
                }
                jobLogger.debug("done", metadata: ["duration": "\(started.duration(to: .now))"])
                return .done(job.attempt, output)
            } catch {
                // Cancelled, or given back as the worker stops (a prefetched job, a generation
                // waiting on a provider): nothing failed.
                if running.wasCancelled(job.attempt) || running.isHandedOff(job.attempt) { return .cancelled(job.attempt) }
                if StorageErrors.isOutOfSpace(error) || (error as? EffectError).map({ StorageErrors.mentionsOutOfSpace($0.description) }) == true,
                   started.duration(to: .now) + pause < configuration.storageWait {
                    jobLogger.warning("the disk is full; waiting for space", metadata: ["retry-in": "\(pause)"])
                    try? await Task.sleep(for: pause)
                    pause = min(pause * 2, .seconds(30))
                    continue
                }
                let effectError = error as? EffectError ?? EffectError("\(error)", retryable: true)
                jobLogger.warning("failed", metadata: ["error": "\(effectError.description)", "retryable": "\(effectError.retryable)"])
                // The service keeps 1,000 characters of an error; more only weighs on the wire.
                return .failed(job.attempt, error: String(effectError.description.prefix(4000)),
                               retryable: effectError.retryable || StorageErrors.mentionsOutOfSpace(effectError.description))
            }
        }
    }
}

extension Worker {
    /// The job's URLs if they are good for a while yet; otherwise fresh ones asked of the jobs
    /// service (`renew`), waited for up to `wait`.
    static func fresh(_ job: JobAssignment, channel: BusChannel, renewed: Renewed, wait: Duration) async throws -> JobTransfer {
        func usable(_ transfer: JobTransfer?) -> JobTransfer? {
            transfer.flatMap { $0.expiresAt.timeIntervalSinceNow > renewalMargin ? $0 : nil }
        }
        if let transfer = usable(renewed.latest(job.attempt) ?? job.transfer) { return transfer }
        channel.send(WorkerMessage.renew(job.attempt))
        let deadline = ContinuousClock.now.advanced(by: wait)
        while ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
            if let transfer = usable(renewed.latest(job.attempt)) { return transfer }
        }
        throw EffectError("the job's URLs expired and the jobs service sent no fresh ones", retryable: true)
    }
}

/// When a job took its place: from then to its end it is in progress (`worker_jobs_in_progress`)
/// and its run time (`worker_job_duration_seconds`) counts; the wait of a prefetched job for a
/// place does not. A job that never had a place (cancelled or given back first) counts as neither.
final class PlaceClock: Sendable {
    private let taken = Mutex<ContinuousClock.Instant?>(nil)

    func start() {
        let first = taken.withLock { taken -> Bool in
            guard taken == nil else { return false }
            taken = .now
            return true
        }
        if first { WorkerMetrics.inProgress.increment() }
    }

    func end(_ effect: String, _ result: WorkerMessage) {
        guard let taken = taken.withLock({ $0 }) else { return }
        WorkerMetrics.inProgress.decrement()
        WorkerMetrics.finished(effect, result, after: taken.duration(to: .now))
    }
}

/// A worker's metrics: jobs in progress, results by effect and outcome, run time by effect.
enum WorkerMetrics {
    static let inProgress = Meter(label: "worker_jobs_in_progress")

    static func finished(_ effect: String, _ result: WorkerMessage, after elapsed: Duration) {
        let outcome = switch result {
        case .done: "completed"
        case .failed(_, _, let retryable): retryable ? "failed_retryable" : "failed"
        case .cancelled: "cancelled"
        default: "other"
        }
        Counter(label: "worker_jobs_total", dimensions: [("effect", effect), ("outcome", outcome)]).increment()
        if case .done = result {
            Metrics.Timer(label: "worker_job_duration_seconds", dimensions: [("effect", effect)]).record(elapsed)
        }
    }
}
