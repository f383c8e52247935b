import Bus
import Foundation
import Logging
import Messages
import ServiceKit
import Synchronization

/// The worker's shell around `WorkerState`: the state behind one lock, and what its actions
/// need that a pure state cannot hold: the continuations of jobs waiting for a place or for
/// the worker to empty, each job's cancel signal, the webhook pokes, how results go out, and
/// the stream of jobs to launch. Every event goes through `apply`, which carries out the
/// actions the state answers, after its lock.
final class WorkerCore: Sendable {
    /// A job to start, on the connection it came by.
    struct Launch: Sendable {
        let job: JobAssignment
        let channel: BusChannel
    }

    let state: Mutex<WorkerState>
    let reports = Reports()
    let pokes = Pokes()
    let logger: Logger
    /// What the `connected` line says of this worker.
    private let connectedMetadata: Logger.Metadata
    /// Jobs to start. Unbounded, but it never holds more than the jobs held (`capacity` plus the
    /// prefetched and the generations waiting on providers).
    let launches: AsyncStream<Launch>
    private let launchInput: AsyncStream<Launch>.Continuation
    private let signals = Mutex<[JobAttempt: CancelSignal]>([:])
    private let placeWaiters = Mutex<[JobAttempt: CheckedContinuation<Void, any Error>]>([:])
    /// Those waiting for the worker to hold no job (`untilEmpty`), by a number of their own.
    private let emptyWaiters = Mutex<(next: Int, waiting: [Int: CheckedContinuation<Void, Never>])>((0, [:]))

    init(state: WorkerState, connectedMetadata: Logger.Metadata, logger: Logger) {
        self.state = Mutex(state)
        self.connectedMetadata = connectedMetadata
        self.logger = logger
        (launches, launchInput) = AsyncStream.makeStream(of: Launch.self)
    }

    /// Runs `event` on the state, then carries out the actions it answers; returns them.
    @discardableResult
    func apply(_ channel: BusChannel?, _ event: (inout WorkerState) -> [WorkerState.Action]) -> [WorkerState.Action] {
        let (actions, gauges) = state.withLock { state in (event(&state), state.changedGauges()) }
        if let gauges {
            WorkerMetrics.inProgress.set(gauges.placesHeld)
            WorkerMetrics.generationsWaiting.set(gauges.generationsWaiting)
        }
        perform(actions, on: channel)
        return actions
    }

    func perform(_ actions: [WorkerState.Action], on channel: BusChannel?) {
        for action in actions {
            switch action {
            case .send(let message): channel?.send(message)
            case .resend(let results): if let channel { reports.resend(results, on: channel) }
            case .launch(let job):
                _ = signal(job.attempt)
                if let channel { launchInput.yield(Launch(job: job, channel: channel)) }
            case .grant(let attempt): placeWaiters.withLock { $0.removeValue(forKey: attempt) }?.resume()
            case .refusePlace(let attempt): placeWaiters.withLock { $0.removeValue(forKey: attempt) }?.resume(throwing: CancellationError())
            case .stop(let attempt): signal(attempt).fire()
            case .poke(let attempt): pokes.poke(attempt, held: true)
            case .sendMetrics: channel?.send(WorkerMessage.metrics(ProcessMetrics.exposition()))
            case .takeBatches: reports.takeBatches()
            case .resetReports: reports.connected()
            case .empty: wakeEmptyWaiters()
            case .reconnect: break
            case .note(let note): log(note)
            }
        }
    }

    private func log(_ note: WorkerState.Note) {
        switch note {
        case .connected: logger.info("connected", metadata: connectedMetadata)
        case .cancelling(let attempt): logger.info("cancelling", metadata: ["job": "\(attempt.jobId)"])
        // Its task ends at once, with the cancel as its result.
        case .cancelledBeforeStart(let attempt): logger.info("cancelled before it started", metadata: ["job": "\(attempt.jobId)"])
        case .refused(let attempt, let reason):
            logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
        case .silent: logger.warning("jobs service silent; reconnecting")
        }
    }

    /// No more jobs start: the worker's group waits for those running, then `run` returns.
    func endLaunches() { launchInput.finish() }

    /// The signal that stops `attempt`'s work (made on first use, by its launch or a stop that
    /// came first); dropped as the job ends (`forget`).
    func signal(_ attempt: JobAttempt) -> CancelSignal {
        signals.withLock { signals in
            if let signal = signals[attempt] { return signal }
            let signal = CancelSignal()
            signals[attempt] = signal
            return signal
        }
    }

    func forget(_ attempt: JobAttempt) {
        _ = signals.withLock { $0.removeValue(forKey: attempt) }
        pokes.forget(attempt)
    }

    /// Returns once `attempt` has one of the places (`WorkerState.askPlace`); throws if the job is
    /// cancelled meanwhile or handed back as the worker stops.
    func takePlace(_ attempt: JobAttempt, channel: BusChannel) async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // Listed first: whoever answers it (a grant, a refusal) finds it.
                placeWaiters.withLock { $0[attempt] = continuation }
                // Cancelled before asking: refused (a cancel after it withdraws the ask, under the same lock).
                apply(channel) { state in Task.isCancelled ? [.refusePlace(attempt)] : state.askPlace(attempt) }
            }
        } onCancel: {
            apply(channel) { $0.withdraw(attempt) }
        }
    }

    /// Returns once no job is held, or the task is cancelled: woken by the last job's end, not by
    /// polling. (A waiter is listed before it looks, so an end between the two cannot be missed;
    /// whoever takes a waiter off the list resumes it, once.)
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
                if now { waiter.resume() } else if state.withLock({ $0.heldCount == 0 }) { wakeEmptyWaiters() }
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
