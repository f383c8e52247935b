import Foundation
import JobsCore
import Messages

/// What the jobs service stores, as the operations its bus methods, its dispatcher and its
/// sweeps need: each write one transaction (group committed), decided by `JobRules`, with its
/// history event, quota settlement and file deletions put in the outbox in that transaction.
/// `JobsHandler`, `Dispatcher` and `UnusedUploadSweeper` depend on this; `SQLiteJobsStore` is
/// today's implementation.
public protocol JobsStore: Sendable {
    /// Creates a queued job; the same id for the same user returns the existing one.
    func create(_ request: CreateJob, effectId: String, parameters: [String: Double], now: Date) async throws -> (job: JobRecord, created: Bool)
    /// Whether a job exists and its status (a purged job whose settlement quota has not heard
    /// yet: the status that settlement stands for); with `abandonIfAbsent`, an absent id is
    /// recorded as abandoned so that a creation arriving later fails.
    func lookup(_ id: String, abandonIfAbsent: Bool, now: Date) async throws -> JobStatus?
    /// The job, if `userId` owns it (nil for anyone else's).
    func job(_ id: String, userId: String?) async throws -> JobRecord?
    /// The jobs of these ids that exist.
    func jobs(_ ids: [String]) async throws -> [JobRecord]
    /// The states of the jobs of these ids that exist.
    func states(_ ids: [String]) async throws -> [String: JobState]
    /// How many jobs are in each state, and how many outbox entries wait for each topic.
    func counts() async throws -> JobCounts
    /// No worker holds the attempt any more: queued again, failed or cancelled.
    func requeue(_ attempt: JobAttempt, reason: String, now: Date) async throws -> JobRecord?
    /// A generation was submitted to a provider for the attempt.
    func recordSubmission(_ attempt: JobAttempt, _ request: ProviderRequest) async throws -> JobReportOutcome
    /// Every processing attempt, for the dispatcher's reconcile.
    func processingAttempts() async throws -> [JobAttempt]
    /// Cancels one of the user's jobs.
    func cancel(_ id: String, userId: String, now: Date) async throws -> JobRecord
    /// Removes one of the user's jobs for good (its files through the outbox).
    func purge(_ id: String, userId: String, now: Date) async throws -> PurgedJob
    /// Those of `keys` that no job uses as its original.
    func unused(_ keys: [String]) async throws -> [String]
    /// A refused result's files, to delete.
    func discardOutput(_ output: JobOutput, of attempt: JobAttempt, now: Date) async throws
    /// At start-up: settles what was left mid-cancel; every queued job, oldest first.
    func recover(now: Date) async throws -> [JobRecord]
    /// Registers a device's push token for its user (`Devices.put`).
    func putDevice(_ device: DeviceRegistration, now: Date) async throws -> DeviceRecord
    /// Removes the user's device; false if the user has none of that token.
    func deleteDevice(userId: String, token: String) async throws -> Bool
    /// Forgets a token its push service no longer knows.
    func forgetDevice(token: String) async throws
    /// Jobs across all users matching `filter` (its provider already resolved to `effectIds`),
    /// newest first, after `cursor`.
    func adminJobs(_ filter: AdminJobFilter, effectIds: [String]?, after cursor: AdminCursor?, limit: Int) async throws -> [JobRecord]
    /// An operator's retry of a failed job (`JobRules.retry`), once quota holds its charge again.
    /// A job whose release has not yet reached quota (its settlement still in the outbox) is not
    /// retried: that late release would give back the new charge.
    func retry(_ id: String, attempts: Int, now: Date) async throws -> JobRetryOutcome
    /// What operators set on dispatching (none set: the defaults).
    func dispatchControls() async throws -> DispatchControls
    /// Makes one change to the controls in a transaction; the controls after it, and whether it
    /// changed them.
    func changeDispatchControls(_ change: DispatchControls.Change) async throws -> (controls: DispatchControls, changed: Bool)
    /// Jobs queued and processing by effect, with the oldest queued one's creation.
    func activeByEffect() async throws -> [EffectLoad]
    /// A job's attempts, first to last.
    func attempts(of jobId: String) async throws -> [AttemptRecord]
    /// Writes an operator's action to the audit log.
    func appendAudit(_ entry: AuditEntry) async throws
    /// The audit log, newest first, before the entry `before`.
    func auditLog(before: Int64?, limit: Int) async throws -> [AuditEntry]

    /// The dispatcher's writes of one event, the one path of every start and result: starts of
    /// queued jobs (processing, as a new attempt; nil if no longer queued) and results of
    /// workers' attempts (`JobRules.report`: completed with the quota `commit` settlement in the
    /// outbox, failed or queued again after a backoff, or cancelled; a refused result's files
    /// discarded), each on its own (one that fails leaves the others). A store may write them in
    /// one transaction.
    /// `workers` names the worker each start is handed to (by job id), kept with the attempt.
    func write(starts: [String], workers: [String: String], results: [(attempt: JobAttempt, result: JobResult)], now: Date) async -> JobsBatchOutcome
}

/// What each write of a batch did, in the order asked.
extension JobsStore {
    /// Starts and results with no worker named for the starts.
    public func write(starts: [String], results: [(attempt: JobAttempt, result: JobResult)], now: Date) async -> JobsBatchOutcome {
        await write(starts: starts, workers: [:], results: results, now: now)
    }
}

/// One effect's jobs waiting and running.
public struct EffectLoad: Sendable, Equatable {
    public var effectId: String
    public var queued: Int
    public var processing: Int
    public var oldestQueuedAt: Date?
}

/// What an operator's retry of one job did.
public enum JobRetryOutcome: Sendable, Equatable {
    /// Queued again.
    case retried(JobRecord)
    /// Not failed (its status; nil: no such job): nothing to retry.
    case notFailed(JobStatus?)
    /// Failed, but its release has not reached quota yet: try again shortly.
    case settling
}

public struct JobsBatchOutcome: Sendable {
    /// The job started (nil: it was no longer queued).
    public var starts: [Result<JobRecord?, any Error>]
    public var results: [Result<(outcome: JobReportOutcome, retryAfter: Duration?), any Error>]

    public init(starts: [Result<JobRecord?, any Error>], results: [Result<(outcome: JobReportOutcome, retryAfter: Duration?), any Error>]) {
        self.starts = starts
        self.results = results
    }
}

/// A store whose reports (a worker's result, a requeue) each read the job, ask `JobRules`, and
/// write what they decide, in one transaction: `report`.
public protocol ReportingJobsStore: JobsStore {
    var retry: RetryPolicy { get }
    /// Reads the job an attempt belongs to, asks `decide`, and writes what it decides.
    func report(_ attempt: JobAttempt, _ decide: @escaping @Sendable (JobRecord) -> JobRules.Decision) async throws -> (outcome: JobReportOutcome, retryAfter: Duration?)
}

extension ReportingJobsStore {
    /// No worker holds the current attempt any more (lost, or never told): queued again, or
    /// failed when attempts are used up, or cancelled when a cancel was asked for meanwhile.
    /// Nil when `attempt` is no longer the job's current processing attempt (fencing).
    public func requeue(_ attempt: JobAttempt, reason: String, now: Date) async throws -> JobRecord? {
        let (outcome, _) = try await report(attempt) { [retry] job in JobRules.requeue(job, attempt, reason: reason, retry: retry, now: now) }
        if case .applied(let job) = outcome { return job }
        return nil
    }
}

/// What a worker's report did to the job.
public enum JobReportOutcome: Sendable, Equatable {
    /// Applied; the job is now in this state.
    case applied(JobRecord)
    /// Refused: a stale attempt, or the job is not processing.
    case refused(String)
    /// This very result was recorded before (a worker sends a result again until it hears that it
    /// is recorded): nothing changes, the worker is told again.
    case alreadyRecorded(JobRecord)
}

/// What a watcher compares of a job: owner, version, status and stored progress.
public struct JobState: Sendable, Equatable {
    public var userId: String
    public var version: Int
    public var status: JobStatus
    public var progress: Double

    public init(userId: String, version: Int, status: JobStatus, progress: Double) {
        self.userId = userId
        self.version = version
        self.status = status
        self.progress = progress
    }
}

/// What `purge` removed: the job as it was (nil when there was none).
public struct PurgedJob: Sendable, Equatable {
    public var job: JobRecord?

    public init(job: JobRecord?) { self.job = job }
}

/// What the metrics read from the store at each scrape.
public struct JobCounts: Sendable, Equatable {
    /// Jobs in each state.
    public var states: [JobStatus: Int] = [:]
    /// Outbox entries waiting, by topic.
    public var outbox: [String: Int] = [:]
    /// When the oldest queued job was created; nil with none queued.
    public var oldestQueued: Date?

    public init(states: [JobStatus: Int] = [:], outbox: [String: Int] = [:], oldestQueued: Date? = nil) {
        self.states = states
        self.outbox = outbox
        self.oldestQueued = oldestQueued
    }
}
