import Foundation
import JobsCore
@testable import JobsService
import Messages
import Testing

/// The operators' reads across users and the audit log, on both stores.
@Suite("Jobs across users, and the audit log", .timeLimit(.minutes(2)))
struct AdminStoreTests {
    @Test(arguments: JobsBackend.allCases) func filtersNarrowAndCursorsPageNewestFirst(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            let store = harness.store, start = harness.now
            // Ten jobs a second apart, of two users; the odd ones fail with an error that holds a % and an _
            for index in 0..<10 {
                _ = try await store.create(CreateJob(jobId: "job-\(index)", userId: index < 6 ? "alice" : "bob", isPro: false, imageKey: "uploads/x/\(index).jpg",
                                                     effectId: index % 3 == 0 ? "blur" : "copy"),
                                           effectId: index % 3 == 0 ? "blur" : "copy", parameters: [:], now: start.addingTimeInterval(Double(index)))
                if index % 2 == 1 {
                    _ = try #require(try await store.start("job-\(index)", now: start))
                    _ = try await store.fail(JobAttempt(jobId: "job-\(index)", attempt: 1), error: "gemini: 100% busy_now #\(index)", retryable: false, now: start)
                }
            }
            func ids(_ filter: AdminJobFilter, effectIds: [String]? = nil, after cursor: AdminCursor? = nil, limit: Int = 50) async throws -> [String] {
                try await store.adminJobs(filter, effectIds: effectIds, after: cursor, limit: limit).map(\.id)
            }
            #expect(try await ids(AdminJobFilter()) == (0..<10).reversed().map { "job-\($0)" })
            #expect(try await ids(AdminJobFilter(state: .failed)) == ["job-9", "job-7", "job-5", "job-3", "job-1"])
            #expect(try await ids(AdminJobFilter(state: .failed, userId: "alice")) == ["job-5", "job-3", "job-1"])
            #expect(try await ids(AdminJobFilter(effect: "blur")) == ["job-9", "job-6", "job-3", "job-0"])
            #expect(try await ids(AdminJobFilter(), effectIds: ["blur"]) == ["job-9", "job-6", "job-3", "job-0"])
            #expect(try await ids(AdminJobFilter(), effectIds: []) == [])
            // Error text, case-insensitive, its % and _ literal
            #expect(try await ids(AdminJobFilter(error: "100% BUSY_now")) == ["job-9", "job-7", "job-5", "job-3", "job-1"])
            #expect(try await ids(AdminJobFilter(error: "#7")) == ["job-7"])
            #expect(try await ids(AdminJobFilter(error: "1_0")) == [])
            // A time range: created at or after `from`, before `to`
            #expect(try await ids(AdminJobFilter(from: start.addingTimeInterval(3), to: start.addingTimeInterval(6))) == ["job-5", "job-4", "job-3"])
            // Pages of three, each after the last one's cursor, cover all once
            var seen: [String] = []
            var cursor: AdminCursor?
            repeat {
                let page = try await store.adminJobs(AdminJobFilter(), effectIds: nil, after: cursor, limit: 3)
                seen += page.map(\.id)
                cursor = page.count == 3 ? AdminCursor(after: page[2]) : nil
                if let text = cursor?.text { #expect(AdminCursor(text: text) == cursor) }
            } while cursor != nil
            #expect(seen == (0..<10).reversed().map { "job-\($0)" })
            #expect(AdminCursor(text: "not a cursor") == nil)
        }
    }

    @Test(arguments: JobsBackend.allCases) func theAuditLogKeepsEachActionNewestFirst(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            for index in 0..<5 {
                try await harness.store.appendAudit(AuditEntry(at: harness.now, actor: "admin", action: "jobs.cancel", target: "job-\(index)",
                                                               filter: index == 4 ? #"{"state":"failed"}"# : nil, count: index))
            }
            let all = try await harness.store.auditLog(before: nil, limit: 100)
            #expect(all.map(\.target) == ["job-4", "job-3", "job-2", "job-1", "job-0"])
            #expect(all[0].filter == #"{"state":"failed"}"# && all[0].count == 4 && all[0].actor == "admin" && all[1].filter == nil)
            let older = try await harness.store.auditLog(before: all[1].id, limit: 2)
            #expect(older.map(\.target) == ["job-2", "job-1"])
        }
    }

    @Test(arguments: JobsBackend.allCases) func aFailedJobIsRetriedOnceItsReleaseReachedQuotaWithItsAttemptsCountingOn(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            let store = harness.store, now = harness.now
            _ = try await harness.created("job-1")
            _ = try await harness.created("job-2")
            // Only a failed job is retried
            #expect(try await store.retry("job-2", attempts: 3, now: now) == .notFailed(.queued))
            #expect(try await store.retry("no-such-job", attempts: 3, now: now) == .notFailed(nil))
            _ = try #require(try await store.start("job-1", now: now))
            _ = try await store.fail(JobAttempt(jobId: "job-1", attempt: 1), error: "gemini: quota exhausted", retryable: false, now: now)
            // Its release still waits in the outbox: quota would give back the new charge
            #expect(try await store.retry("job-1", attempts: 3, now: now) == .settling)
            let settlements = try await harness.settlements.due(now: now.addingTimeInterval(1), limit: 10)
            #expect(settlements.count == 1)
            try await harness.settlements.acknowledge(settlements.map(\.id))

            guard case .retried(let queued) = try await store.retry("job-1", attempts: 3, now: now.addingTimeInterval(5)) else {
                Issue.record("a failed job whose release was delivered is retried")
                return
            }
            #expect(queued.status == .queued && queued.lastError == nil && queued.finishedAt == nil && queued.progress == 0)
            #expect(queued.attempts == 1 && queued.maxAttempts == 4)
            let stored = try #require(try await store.job("job-1", userId: nil))
            #expect(stored.status == .queued && stored.maxAttempts == 4 && stored.version == queued.version && stored.lastError == nil && stored.finishedAt == nil)
            // History hears the new state
            #expect(try await harness.dueForHistory(at: now.addingTimeInterval(6)).contains { $0.event.job.id == "job-1" && $0.event.job.status == .queued })
            // Idempotent: queued now, not failed
            #expect(try await store.retry("job-1", attempts: 3, now: now) == .notFailed(.queued))
            // It runs as attempt 2; a late report of attempt 1 stays fenced off
            let started = try #require(try await store.start("job-1", now: now.addingTimeInterval(6)))
            #expect(started.attempts == 2)
            let late = try await store.fail(JobAttempt(jobId: "job-1", attempt: 1), error: "late", retryable: false, now: now.addingTimeInterval(7))
            #expect({ if case .refused = late.0 { true } else { false } }(), "a report of attempt 1 is stale: \(late.0)")
            #expect(try await store.job("job-1", userId: nil)?.status == .processing)
        }
    }

    @Test(arguments: JobsBackend.allCases) func dispatchControlsAreKeptAndEachChangeSaysWhetherItChangedThem(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            let store = harness.store
            #expect(try await store.dispatchControls() == DispatchControls())
            #expect(try await store.changeDispatchControls(.pauseProvider("gemini")) == (DispatchControls(pausedProviders: ["gemini"]), true))
            #expect(try await store.changeDispatchControls(.pauseProvider("gemini")).changed == false)
            _ = try await store.changeDispatchControls(.pauseEffect("blur"))
            _ = try await store.changeDispatchControls(.providerLimit("fal", 4))
            _ = try await store.changeDispatchControls(.drain("gpu-1"))
            let expected = DispatchControls(pausedEffects: ["blur"], pausedProviders: ["gemini"], providerLimits: ["fal": 4], drainedWorkers: ["gpu-1"])
            #expect(try await store.dispatchControls() == expected)
            _ = try await store.changeDispatchControls(.resumeProvider("gemini"))
            _ = try await store.changeDispatchControls(.providerLimit("fal", nil))
            _ = try await store.changeDispatchControls(.undrain("gpu-1"))
            #expect(try await store.dispatchControls() == DispatchControls(pausedEffects: ["blur"]))
        }
    }

    @Test(arguments: JobsBackend.allCases) func theQueueByEffectCountsQueuedAndProcessingJobsWithTheOldestQueued(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            let store = harness.store, start = harness.now
            for index in 0..<4 {
                _ = try await store.create(CreateJob(jobId: "job-\(index)", userId: "alice", isPro: false, imageKey: "uploads/x/\(index).jpg", effectId: index < 3 ? "copy" : "blur"),
                                           effectId: index < 3 ? "copy" : "blur", parameters: [:], now: start.addingTimeInterval(Double(index)))
            }
            _ = try #require(try await store.start("job-0", now: start))
            _ = try #require(try await store.start("job-3", now: start))
            _ = try await store.fail(JobAttempt(jobId: "job-3", attempt: 1), error: "no", retryable: false, now: start)
            let loads = try await store.activeByEffect()
            #expect(loads.map(\.effectId) == ["copy"])
            #expect(loads.first?.queued == 2 && loads.first?.processing == 1)
            #expect(abs((loads.first?.oldestQueuedAt ?? .distantPast).timeIntervalSince(start.addingTimeInterval(1))) < 0.01)
        }
    }

    @Test(arguments: JobsBackend.allCases) func eachAttemptIsKeptWithItsWorkerStartEndOutcomeAndError(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            let store = harness.store, now = harness.now
            _ = try await harness.created("job-1")
            // Attempt 1 on gpu-1 fails and the job is queued again; attempt 2 on gpu-2 completes
            _ = try await store.write(starts: ["job-1"], workers: ["job-1": "gpu-1"], results: [], now: now).starts[0].get()
            _ = try await store.fail(JobAttempt(jobId: "job-1", attempt: 1), error: "provider busy", retryable: true, now: now.addingTimeInterval(2))
            let running = try await store.attempts(of: "job-1")
            #expect(running.map(\.outcome) == ["retry"] && running.first?.workerId == "gpu-1" && running.first?.error == "provider busy")
            _ = try await store.write(starts: ["job-1"], workers: ["job-1": "gpu-2"], results: [], now: now.addingTimeInterval(3)).starts[0].get()
            let second = try await store.attempts(of: "job-1")
            #expect(second.count == 2 && second[1].workerId == "gpu-2" && second[1].endedAt == nil && second[1].outcome == nil)
            let done = JobResult.done(JobOutput(resultKey: "results/alice/job-1.jpg", thumbnailKey: "thumbnails/alice/job-1.jpg"))
            _ = try await store.write(starts: [], results: [(JobAttempt(jobId: "job-1", attempt: 2), done)], now: now.addingTimeInterval(5)).results[0].get()
            let attempts = try await store.attempts(of: "job-1")
            #expect(attempts.map(\.attempt) == [1, 2] && attempts.map(\.outcome) == ["retry", "completed"] && attempts[1].error == nil)
            #expect(abs((attempts[0].endedAt ?? .distantPast).timeIntervalSince(now.addingTimeInterval(2))) < 0.01)
            #expect(abs(attempts[1].startedAt.timeIntervalSince(now.addingTimeInterval(3))) < 0.01)
            // A late report of the first attempt changes nothing; a purge removes them
            _ = try await store.fail(JobAttempt(jobId: "job-1", attempt: 1), error: "late", retryable: false, now: now.addingTimeInterval(6))
            #expect(try await store.attempts(of: "job-1") == attempts)
            _ = try await store.purge("job-1", userId: "alice", now: now.addingTimeInterval(7))
            #expect(try await store.attempts(of: "job-1").isEmpty)
            #expect(try await store.attempts(of: "no-such-job").isEmpty)
        }
    }
}
