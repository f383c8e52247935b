import Foundation
import JobsCore
import Messages
import Testing

@Suite("Job rules", .timeLimit(.minutes(5)))
struct JobRulesTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)
    let retry = RetryPolicy(maxAttempts: 3, baseDelay: .seconds(1), maxDelay: .seconds(60))

    func job(_ status: JobStatus = .queued, attempts: Int = 0, cancelRequested: Bool = false) -> JobRecord {
        JobRecord(
            id: "j", userId: "u", isPro: false, imageKey: "uploads/u/a.jpg", effectId: "copy", parameters: [:], prompt: nil,
            status: status, progress: 0, attempts: attempts, maxAttempts: 3, lastError: nil, resultKey: nil, thumbnailKey: nil,
            createdAt: now, updatedAt: now, startedAt: nil, finishedAt: nil, version: 1, cancelRequested: cancelRequested
        )
    }

    func applied(_ decision: JobRules.Decision) throws -> JobRules.Transition {
        guard case .apply(let transition) = decision else { throw Unexpected(decision: "\(decision)") }
        return transition
    }

    struct Unexpected: Error { var decision: String }

    @Test func startMakesANewAttemptOfAQueuedJobOnly() throws {
        let later = now.addingTimeInterval(5)
        let started = try #require(JobRules.start(job(), now: later))
        #expect(started.job.status == .processing && started.job.attempts == 1 && started.job.version == 2)
        #expect(started.job.startedAt == later && started.job.updatedAt == later && started.settlement == nil)
        // A second start keeps the first start time; a job no longer queued is not started
        var again = started.job
        again.status = .queued
        #expect(JobRules.start(again, now: later.addingTimeInterval(5))?.job.startedAt == later)
        for status in [JobStatus.processing, .completed, .failed, .cancelled] {
            #expect(JobRules.start(job(status, attempts: 1), now: later) == nil)
        }
    }

    @Test func completingTheCurrentAttemptCommitsTheCharge() throws {
        let output = JobOutput(resultKey: "r", thumbnailKey: "t")
        let done = try applied(JobRules.complete(job(.processing, attempts: 1), JobAttempt(jobId: "j", attempt: 1), output: output, now: now))
        #expect(done.job.status == .completed && done.job.progress == 1 && done.job.resultKey == "r" && done.job.thumbnailKey == "t")
        #expect(done.settlement == .commit && done.job.finishedAt == now && done.job.version == 2)
        // The same result again is recognised; a different one for the same attempt is refused
        #expect(JobRules.complete(done.job, JobAttempt(jobId: "j", attempt: 1), output: output, now: now) == .alreadyRecorded(done.job))
        guard case .refuse = JobRules.complete(done.job, JobAttempt(jobId: "j", attempt: 1), output: JobOutput(resultKey: "x", thumbnailKey: "y"), now: now) else {
            Issue.record("a different result was not refused")
            return
        }
    }

    @Test func staleAttemptsAreFencedOff() {
        let current = job(.processing, attempts: 2)
        let stale = JobAttempt(jobId: "j", attempt: 1)
        for decision in [
            JobRules.complete(current, stale, output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now),
            JobRules.fail(current, stale, error: "x", retryable: true, retry: retry, now: now),
            JobRules.cancelled(current, stale, now: now),
            JobRules.requeue(current, stale, reason: "lost", retry: retry, now: now),
        ] {
            guard case .refuse(let reason) = decision else {
                Issue.record("stale attempt not refused: \(decision)")
                continue
            }
            #expect(reason.contains("stale"))
        }
        // And a report about a job that is not processing changes nothing
        guard case .refuse = JobRules.complete(job(.queued, attempts: 1), JobAttempt(jobId: "j", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now) else {
            Issue.record("a result for a queued job was accepted")
            return
        }
    }

    @Test func retryableFailuresBackOffThenFailAndRelease() throws {
        var current = job(.processing, attempts: 1)
        // Attempt 1 and 2 fail retryably: queued again after 1 s, then 2 s
        for (attempt, wait) in [(1, Duration.seconds(1)), (2, .seconds(2))] {
            current.attempts = attempt
            let failed = try applied(JobRules.fail(current, JobAttempt(jobId: "j", attempt: attempt), error: "busy", retryable: true, retry: retry, now: now))
            #expect(failed.job.status == .queued && failed.retryAfter == wait && failed.settlement == nil && failed.job.lastError == "busy")
            current = failed.job
            current.status = .processing
        }
        // Attempt 3 (the last) fails: failed for good, charge released
        current.attempts = 3
        let last = try applied(JobRules.fail(current, JobAttempt(jobId: "j", attempt: 3), error: "busy", retryable: true, retry: retry, now: now))
        #expect(last.job.status == .failed && last.settlement == .release && last.retryAfter == nil && last.job.finishedAt == now)
        // A failure that is not retryable fails at once; a long error is cut
        let fatal = try applied(JobRules.fail(job(.processing, attempts: 1), JobAttempt(jobId: "j", attempt: 1), error: String(repeating: "e", count: 5000), retryable: false, retry: retry, now: now))
        #expect(fatal.job.status == .failed && fatal.settlement == .release && fatal.job.lastError?.count == JobRules.maxErrorLength)
        // And a retryable failure of a job whose cancel was asked for is not retried
        let cancelAsked = try applied(JobRules.fail(job(.processing, attempts: 1, cancelRequested: true), JobAttempt(jobId: "j", attempt: 1), error: "busy", retryable: true, retry: retry, now: now))
        #expect(cancelAsked.job.status == .failed)
    }

    @Test func cancelAtEachState() throws {
        // Queued: cancelled at once, charge released
        guard case .apply(let queued) = JobRules.cancel(job(.queued), now: now) else { throw Unexpected(decision: "queued") }
        #expect(queued.job.status == .cancelled && queued.settlement == .release && queued.job.version == 2)
        // Processing: marked, not a state change (same version); the worker's `cancelled` ends it
        guard case .mark(let marked) = JobRules.cancel(job(.processing, attempts: 1), now: now) else { throw Unexpected(decision: "processing") }
        #expect(marked.status == .processing && marked.cancelRequested && marked.version == 1)
        #expect(JobRules.cancel(marked, now: now) == .unchanged(marked))
        let stopped = try applied(JobRules.cancelled(marked, JobAttempt(jobId: "j", attempt: 1), now: now))
        #expect(stopped.job.status == .cancelled && stopped.settlement == .release)
        // Cancelled: nothing; completed or failed: too late
        #expect(JobRules.cancel(stopped.job, now: now) == .unchanged(stopped.job))
        #expect(JobRules.cancel(job(.completed, attempts: 1), now: now) == .alreadyFinished(.completed))
        #expect(JobRules.cancel(job(.failed, attempts: 1), now: now) == .alreadyFinished(.failed))
    }

    @Test func aLostAttemptIsRetriedOrCancelledAsAsked() throws {
        let requeued = try applied(JobRules.requeue(job(.processing, attempts: 1), JobAttempt(jobId: "j", attempt: 1), reason: "worker lost", retry: retry, now: now))
        #expect(requeued.job.status == .queued && requeued.job.lastError == "worker lost")
        let cancelled = try applied(JobRules.requeue(job(.processing, attempts: 1, cancelRequested: true), JobAttempt(jobId: "j", attempt: 1), reason: "worker lost", retry: retry, now: now))
        #expect(cancelled.job.status == .cancelled && cancelled.settlement == .release)
        let used = try applied(JobRules.requeue(job(.processing, attempts: 3), JobAttempt(jobId: "j", attempt: 3), reason: "worker lost", retry: retry, now: now))
        #expect(used.job.status == .failed && used.settlement == .release)
        // After a restart, only a processing job with a cancel asked for is ended
        #expect(JobRules.recover(job(.processing, attempts: 1, cancelRequested: true), now: now)?.job.status == .cancelled)
        #expect(JobRules.recover(job(.processing, attempts: 1), now: now) == nil)
        #expect(JobRules.purgeSettlement(job(.queued)) == .release)
        #expect(JobRules.purgeSettlement(job(.completed, attempts: 1)) == nil)
    }

    @Test func aLostAttemptKeepsItsProviderRequestAndAReportedFailureEndsIt() throws {
        var job = self.job(.processing, attempts: 1)
        let request = ProviderRequest(provider: "fal", requestId: "r1", statusURL: "s", responseURL: "r", cancelURL: nil, submittedAt: now)
        guard case .apply(let submitted) = JobRules.submitted(job, JobAttempt(jobId: job.id, attempt: 1), request) else { Issue.record("not applied"); return }
        job = submitted.job
        #expect(job.submission == request && job.version == 1, "not a state change")
        #expect(JobRules.submitted(job, JobAttempt(jobId: job.id, attempt: 1), request) == .alreadyRecorded(job))
        if case .apply(let lost) = JobRules.requeue(job, JobAttempt(jobId: job.id, attempt: 1), reason: "lost", retry: retry, now: now) {
            #expect(lost.job.status == .queued && lost.job.submission == request)
        } else { Issue.record("requeue refused") }
        if case .apply(let failed) = JobRules.fail(job, JobAttempt(jobId: job.id, attempt: 1), error: "timeout", retryable: true, retry: retry, now: now) {
            #expect(failed.job.status == .queued && failed.job.submission == nil)
        } else { Issue.record("fail refused") }
    }
}
