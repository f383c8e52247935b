import Blobs
import Bus
import Foundation
import Logging
import Messages
import Metrics
import Synchronization
import Tracing

/// One job on a worker, in its own task of `Worker.run`'s group from its assignment to its end.
extension Worker {
    /// URLs closer than this to their expiry are renewed before use (a store checks a URL when
    /// a request starts, so a transfer begun in time completes).
    static let renewalMargin: TimeInterval = 2

    /// Runs a job (in its own task of `run`'s group, from its assignment): it takes a place once
    /// its input is ready (`place`), and gives it to the next job when it ends, or earlier when
    /// its image model answered or its generation waits in a provider's queue. A cancel
    /// (`Running.cancel`, or the hand-off as the worker stops) fires the job's signal, which
    /// cancels its work.
    func runJob(_ job: JobAssignment, channel: BusChannel, core: WorkerCore) async {
        let attempt = job.attempt
        let placed = PlaceClock()
        let hooks = EffectRunner.GenerationHooks(
            submitted: { request in
                core.state.withLock { $0.submitted(attempt, request) }
                channel.send(WorkerMessage.submitted(attempt, request))
                core.apply(channel) { $0.detach(attempt).1 }
            },
            wait: { interval in try await core.pokes.wait(attempt, interval) },
            handedOff: { core.state.withLock { $0.isHandedOff(attempt) } },
            answered: {
                var released = false
                core.apply(channel) { state in
                    let (first, actions) = state.release(attempt)
                    released = first
                    return actions
                }
                if released { channel.send(WorkerMessage.answered(attempt)) }
            },
            place: {
                try await core.takePlace(attempt, channel: channel)
                placed.start()
            }
        )
        let signal = core.signal(attempt)
        // The run joins the job's trace (its dispatch); the provider's and the store's HTTP calls
        // made inside it are its children.
        let result = await BusTracing.span("worker.run", continuing: job.traceParent, ofKind: .consumer, attributes: [
            "photoedit.job.id": attempt.jobId, "photoedit.job.attempt": "\(attempt.attempt)", "photoedit.effect": job.effect.id,
        ]) {
            await executeUnlessCancelled(job, signal: signal, channel: channel, core: core, hooks: hooks)
        }
        placed.end(job.effect.id, result)
        core.forget(attempt)
        // Given back as the worker stops: the service queued it again already, nothing to report.
        // Otherwise the result is kept before it is sent, so a `recorded` that comes at once
        // finds it, and sent with others ending at once (to a service that takes batches).
        let handedOff = core.state.withLock { $0.isHandedOff(attempt) }
        core.apply(channel) { $0.ended(attempt, result: handedOff ? nil : result) }
        if !handedOff { await core.reports.send(result, on: channel) }
    }

    /// Runs the attempt until it ends or its cancel signal comes, whichever is first; the other
    /// is cancelled (the job's work by its signal, the signal's wait by the job's end).
    private func executeUnlessCancelled(
        _ job: JobAssignment, signal: CancelSignal, channel: BusChannel, core: WorkerCore, hooks: EffectRunner.GenerationHooks
    ) async -> WorkerMessage {
        await withTaskGroup(of: WorkerMessage?.self) { group in
            group.addTask { await execute(job, channel: channel, core: core, hooks: hooks) }
            group.addTask {
                await signal.wait()
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

    /// Runs one attempt and returns its result message. While the disk is full the attempt
    /// waits for space (up to `storageWait`) instead of failing: a full disk is the operator's
    /// to fix, not a reason to use up the job's attempts.
    private func execute(_ job: JobAssignment, channel: BusChannel, core: WorkerCore, hooks: EffectRunner.GenerationHooks) async -> WorkerMessage {
        var jobLogger = logger
        jobLogger[metadataKey: "job"] = "\(job.attempt.jobId)"
        jobLogger[metadataKey: "attempt"] = "\(job.attempt.attempt)"
        jobLogger.debug("started", metadata: ["effect": "\(job.effect.id)"])
        return await attempt(job, channel: channel, core: core, hooks: hooks, logger: jobLogger, started: .now)
    }

    private func attempt(_ job: JobAssignment, channel: BusChannel, core: WorkerCore, hooks: EffectRunner.GenerationHooks,
                         logger jobLogger: Logger, started: ContinuousClock.Instant) async -> WorkerMessage {
        var pause = Duration.seconds(1)
        let heartbeat = configuration.heartbeat
        while true {
            do {
                let output = try await runner.run(job, transfer: {
                    try await Self.fresh(job, channel: channel, core: core, wait: max(.seconds(5), heartbeat * 5))
                }, hooks: hooks) { fraction in
                    channel.send(WorkerMessage.progress(job.attempt, fraction: fraction))
                }
                if core.state.withLock({ $0.wasCancelled(job.attempt) }) {
                    jobLogger.info("cancelled")
                    return .cancelled(job.attempt)
                }
                jobLogger.debug("done", metadata: ["duration": "\(started.duration(to: .now))"])
                return .done(job.attempt, output)
            } catch {
                // Cancelled, or given back as the worker stops (a prefetched job, a generation
                // waiting on a provider): nothing failed.
                if core.state.withLock({ $0.wasCancelled(job.attempt) || $0.isHandedOff(job.attempt) }) { return .cancelled(job.attempt) }
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

    /// The job's URLs if they are good for a while yet; otherwise fresh ones asked of the jobs
    /// service (`renew`), waited for up to `wait`.
    static func fresh(_ job: JobAssignment, channel: BusChannel, core: WorkerCore, wait: Duration) async throws -> JobTransfer {
        func usable(_ transfer: JobTransfer?) -> JobTransfer? {
            transfer.flatMap { $0.expiresAt.timeIntervalSinceNow > renewalMargin ? $0 : nil }
        }
        if let transfer = usable(core.state.withLock({ $0.latestTransfer(job.attempt) }) ?? job.transfer) { return transfer }
        channel.send(WorkerMessage.renew(job.attempt))
        let deadline = ContinuousClock.now.advanced(by: wait)
        while ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
            if let transfer = usable(core.state.withLock({ $0.latestTransfer(job.attempt) })) { return transfer }
        }
        throw EffectError("the job's URLs expired and the jobs service sent no fresh ones", retryable: true)
    }
}

/// When a job took its place: from then to its end its run time (`worker_job_duration_seconds`)
/// counts; the wait of a prefetched job for a place does not. A job that never had a place
/// (cancelled or given back first) does not count.
final class PlaceClock: Sendable {
    private let taken = Mutex<ContinuousClock.Instant?>(nil)

    func start() {
        taken.withLock { taken in
            if taken == nil { taken = .now }
        }
    }

    func end(_ effect: String, _ result: WorkerMessage) {
        guard let taken = taken.withLock({ $0 }) else { return }
        WorkerMetrics.finished(effect, result, after: taken.duration(to: .now))
    }
}

/// A worker's metrics: places held and generations waiting (set from `WorkerState` as they
/// change), results by effect and outcome, run time by effect.
enum WorkerMetrics {
    /// Jobs holding one of the worker's places (at most its capacity).
    static let inProgress = Meter(label: "worker_jobs_in_progress")
    /// Generations waiting at a provider's queue without a place.
    static let generationsWaiting = Meter(label: "worker_generations_waiting")

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
