import Foundation
import Messages

/// The rules of one job's life, as pure functions of the job's row: what each report or request
/// does to it, and what must be written with it. The store reads the row, asks these rules, and
/// writes what they answer in one transaction: the row, a history event for every state change,
/// and the quota settlement when the job ends. Nothing here touches a database or a clock.
///
///     queued ──start──▶ processing ──done──▶ completed            (quota: commit)
///       ▲                  │  │ └──failed, no attempts left──▶ failed  (quota: release)
///       └──retryable fail──┘  └──cancelled──▶ cancelled          (quota: release)
///     queued ──cancel──▶ cancelled                                (quota: release)
public enum JobRules {
    /// What a job's end does to the user's quota reservation.
    public enum Settlement: String, Sendable, Equatable {
        /// The edit happened: the charge stays.
        case commit
        /// It did not: the charge is given back.
        case release
    }

    /// A change to apply: the job's new row (its version bumped, so a history event goes with
    /// it), the settlement to send to quota, and for a retryable failure the wait before the job
    /// may be handed out again.
    public struct Transition: Sendable, Equatable {
        public var job: JobRecord
        public var settlement: Settlement?
        public var retryAfter: Duration?
    }

    /// The answer to a worker's report about an attempt.
    public enum Decision: Sendable, Equatable {
        /// Apply this change.
        case apply(Transition)
        /// Refused: a stale attempt, or the job is not processing. Nothing changes.
        case refuse(String)
        /// This very result was recorded before (a worker sends a result again until it hears
        /// that it is recorded): nothing changes, and the worker is told again.
        case alreadyRecorded(JobRecord)
    }

    /// The longest error text kept on a job.
    public static let maxErrorLength = 1000

    /// Starts attempt `attempts + 1`. Nil if the job is no longer queued (cancelled meanwhile).
    public static func start(_ job: JobRecord, now: Date) -> Transition? {
        guard job.status == .queued else { return nil }
        var job = job
        job.status = .processing
        job.attempts += 1
        job.progress = 0
        job.startedAt = job.startedAt ?? now
        return Transition(job: changed(job, now: now))
    }

    /// What a worker's result does: `complete`, `fail` or `cancelled`.
    public static func report(_ job: JobRecord, _ attempt: JobAttempt, _ result: JobResult, retry: RetryPolicy, now: Date) -> Decision {
        switch result {
        case .done(let output): complete(job, attempt, output: output, now: now)
        case .failed(let error, let retryable): fail(job, attempt, error: error, retryable: retryable, retry: retry, now: now)
        case .cancelled: cancelled(job, attempt, now: now)
        }
    }

    /// The current attempt finished: completed, quota committed.
    public static func complete(_ job: JobRecord, _ attempt: JobAttempt, output: JobOutput, now: Date) -> Decision {
        if let early = fence(job, attempt, recordedAs: { $0.status == .completed && $0.resultKey == output.resultKey }) { return early }
        var job = job
        job.status = .completed
        job.progress = 1
        job.resultKey = output.resultKey
        job.thumbnailKey = output.thumbnailKey
        job.finishedAt = now
        job.lastError = nil
        return .apply(Transition(job: changed(job, now: now), settlement: .commit))
    }

    /// The current attempt failed: queued again after the policy's backoff if `retryable` and
    /// attempts remain and no cancel was asked for; else failed, charge released.
    public static func fail(_ job: JobRecord, _ attempt: JobAttempt, error: String, retryable: Bool, retry: RetryPolicy, now: Date,
                            keepSubmission: Bool = false) -> Decision {
        let error = String(error.prefix(maxErrorLength))
        if let early = fence(job, attempt, recordedAs: { ($0.status == .failed || $0.status == .queued) && $0.lastError == error }) { return early }
        var job = job
        job.lastError = error
        // A failure the worker reports ends the provider's request with it: a retry submits
        // anew. (A lost worker's requeue keeps it: the next attempt waits on the same request.)
        if !keepSubmission { job.submission = nil }
        if retryable && job.attempts < job.maxAttempts && !job.cancelRequested {
            job.status = .queued
            job.progress = 0
            return .apply(Transition(job: changed(job, now: now), retryAfter: retry.delay(after: job.attempts)))
        }
        job.status = .failed
        job.finishedAt = now
        return .apply(Transition(job: changed(job, now: now), settlement: .release))
    }

    /// The worker stopped the current attempt after a cancel: cancelled, charge released.
    public static func cancelled(_ job: JobRecord, _ attempt: JobAttempt, now: Date) -> Decision {
        if let early = fence(job, attempt, recordedAs: { $0.status == .cancelled }) { return early }
        var job = job
        job.status = .cancelled
        job.finishedAt = now
        return .apply(Transition(job: changed(job, now: now), settlement: .release))
    }

    /// No worker holds the current attempt any more (it was lost, or never told). With a cancel
    /// asked for, the job is cancelled; otherwise this counts as a retryable failure (queued
    /// again at once by the dispatcher, or failed when its attempts are used up). Refused when
    /// `attempt` is not the job's current processing attempt (fencing: a late repair never undoes
    /// a result).
    public static func requeue(_ job: JobRecord, _ attempt: JobAttempt, reason: String, retry: RetryPolicy, now: Date) -> Decision {
        guard job.status == .processing, job.attempts == attempt.attempt else {
            return .refuse(job.status == .processing ? "stale attempt \(attempt.attempt)" : "job is \(job.status.rawValue)")
        }
        if job.cancelRequested { return cancelled(job, attempt, now: now) }
        return fail(job, attempt, error: reason, retryable: true, retry: retry, now: now, keepSubmission: true)
    }

    /// The current attempt submitted its generation to a provider's queue: the request is kept
    /// on the row (the job stays processing; not a state change, so its version stays). The
    /// same request again is already recorded; another one for the same attempt replaces it.
    public static func submitted(_ job: JobRecord, _ attempt: JobAttempt, _ request: ProviderRequest) -> Decision {
        guard job.status == .processing else { return .refuse("job is \(job.status.rawValue)") }
        guard job.attempts == attempt.attempt else {
            return .refuse("stale attempt \(attempt.attempt); the current attempt is \(job.attempts)")
        }
        if job.submission == request { return .alreadyRecorded(job) }
        var job = job
        job.submission = request
        return .apply(Transition(job: job))
    }

    /// What the user's cancel does.
    public enum CancelDecision: Sendable, Equatable {
        /// A queued job is cancelled at once, its charge released.
        case apply(Transition)
        /// A processing job is marked (`cancelRequested`, version unchanged: not a state
        /// change); the dispatcher tells its worker, whose `cancelled` ends it.
        case mark(JobRecord)
        /// Cancelled already, or marked already: nothing to do.
        case unchanged(JobRecord)
        /// Completed or failed: too late.
        case alreadyFinished(JobStatus)
    }

    public static func cancel(_ job: JobRecord, now: Date) -> CancelDecision {
        switch job.status {
        case .completed, .failed:
            return .alreadyFinished(job.status)
        case .cancelled:
            return .unchanged(job)
        case .queued:
            var job = job
            job.status = .cancelled
            job.finishedAt = now
            job.cancelRequested = true
            return .apply(Transition(job: changed(job, now: now), settlement: .release))
        case .processing:
            guard !job.cancelRequested else { return .unchanged(job) }
            var job = job
            job.cancelRequested = true
            job.updatedAt = now
            return .mark(job)
        }
    }

    /// At start-up: a job left processing with a cancel asked for is cancelled (its worker may
    /// never report again). Other processing jobs stay: their workers name them in heartbeats.
    public static func recover(_ job: JobRecord, now: Date) -> Transition? {
        guard job.status == .processing, job.cancelRequested else { return nil }
        var job = job
        job.status = .cancelled
        job.finishedAt = now
        return Transition(job: changed(job, now: now), settlement: .release)
    }

    /// An operator's retry: a failed job is queued again with the same id, its error, result and
    /// provider request cleared, and `attempts` more attempts allowed. Attempts go on counting
    /// from where they were (attempt 4 after 3), so a late report of an old attempt stays fenced
    /// off. Nil for a job that is not failed.
    public static func retry(_ job: JobRecord, attempts: Int, now: Date) -> Transition? {
        guard job.status == .failed else { return nil }
        var job = job
        job.status = .queued
        job.progress = 0
        job.maxAttempts = job.attempts + max(1, attempts)
        job.lastError = nil
        job.resultKey = nil
        job.thumbnailKey = nil
        job.startedAt = nil
        job.finishedAt = nil
        job.cancelRequested = false
        job.submission = nil
        return Transition(job: changed(job, now: now))
    }

    /// A job deleted before it ended gives its charge back, as a cancel would.
    public static func purgeSettlement(_ job: JobRecord) -> Settlement? {
        job.status.isTerminal ? nil : .release
    }

    // MARK: Helpers

    /// Nil when `attempt` is the job's current processing attempt (go on); otherwise the answer:
    /// already recorded if it is the latest attempt and the job shows this very result, else a
    /// refusal.
    static func fence(_ job: JobRecord, _ attempt: JobAttempt, recordedAs: (JobRecord) -> Bool) -> Decision? {
        if job.status != .processing, job.attempts == attempt.attempt, recordedAs(job) { return .alreadyRecorded(job) }
        guard job.status == .processing else { return .refuse("job is \(job.status.rawValue)") }
        guard job.attempts == attempt.attempt else {
            return .refuse("stale attempt \(attempt.attempt); the current attempt is \(job.attempts)")
        }
        return nil
    }

    /// A state change: a new version (history applies each once) and the time.
    static func changed(_ job: JobRecord, now: Date) -> JobRecord {
        var job = job
        job.version += 1
        job.updatedAt = now
        return job
    }
}

/// What a worker reports of an attempt: the result the store records.
public enum JobResult: Sendable, Equatable {
    case done(JobOutput)
    case failed(error: String, retryable: Bool)
    case cancelled
}
