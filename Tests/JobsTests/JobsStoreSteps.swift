import Foundation
import JobsCore
import JobsService
import Messages

/// One start or one result at a time, for the store tests: each through the one path the
/// dispatcher writes them by, `write(starts:results:now:)`.
extension JobsStore {
    /// A queued job started: processing, as a new attempt; nil if it is not queued.
    func start(_ id: String, now: Date) async throws -> JobRecord? {
        try await write(starts: [id], results: [], now: now).starts[0].get()
    }

    func record(_ attempt: JobAttempt, _ result: JobResult, now: Date) async throws -> (outcome: JobReportOutcome, retryAfter: Duration?) {
        try await write(starts: [], results: [(attempt, result)], now: now).results[0].get()
    }

    /// The current attempt completed (the quota `commit` settlement in the outbox).
    func complete(_ attempt: JobAttempt, output: JobOutput, now: Date) async throws -> JobReportOutcome {
        try await record(attempt, .done(output), now: now).outcome
    }

    /// The current attempt failed: queued again after a backoff (returned), or failed for good.
    func fail(_ attempt: JobAttempt, error: String, retryable: Bool, now: Date) async throws -> (JobReportOutcome, retryAfter: Duration?) {
        try await record(attempt, .failed(error: error, retryable: retryable), now: now)
    }

    /// The worker stopped the attempt for a cancel.
    func cancelled(_ attempt: JobAttempt, now: Date) async throws -> JobReportOutcome {
        try await record(attempt, .cancelled, now: now).outcome
    }
}
