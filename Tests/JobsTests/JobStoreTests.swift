import Foundation
import GRDB
import JobsCore
@testable import JobsService
import Messages
import ServiceKit
import Synchronization
import Testing
import TestSupport

@Suite("Job store", .timeLimit(.minutes(5)))
struct JobStoreTests {
    let store: SQLiteJobsStore
    let now = Date()

    init() throws {
        store = SQLiteJobsStore(
            database: try JobsDatabase.inMemory(), retry: RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10)),
            effectTitles: ["copy": "Original"]
        )
    }

    func created(_ id: String = "job-1", user: String = "alice", imageKey: String = "uploads/x/y.jpg") async throws -> JobRecord {
        try await store.create(CreateJob(jobId: id, userId: user, isPro: false, imageKey: imageKey, effectId: "copy"), effectId: "copy", parameters: [:], now: now).job
    }

    func outbox() async throws -> [OutboxEntry] {
        try await store.database.read { try OutboxEntry.order(Column("id")).fetchAll($0) }
    }

    @Test func manyJobsCompletingAtOnceShareFewTransactions() async throws {
        // Given 200 running jobs
        for index in 0..<200 { _ = try await created("job-\(index)", user: "user-\(index % 7)") }
        let before = store.writeStatistics
        let started = try await withThrowingTaskGroup(of: JobRecord?.self) { group in
            for index in 0..<200 { group.addTask { [store, now] in try await store.start("job-\(index)", now: now) } }
            return try await group.reduce(into: [JobRecord]()) { if let job = $1 { $0.append(job) } }
        }
        #expect(started.count == 200)
        let afterStarts = store.writeStatistics
        // When they all complete at once
        try await withThrowingTaskGroup(of: Void.self) { group in
            for job in started {
                group.addTask { [store, now] in
                    let outcome = try await store.complete(JobAttempt(jobId: job.id, attempt: job.attempts), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
                    guard case .applied = outcome else { throw CancellationError() }
                }
            }
            try await group.waitForAll()
        }
        let afterCompletions = store.writeStatistics
        // Then the starts and the completions each took far fewer transactions than jobs, and
        // every completion is on disk with its quota settlement in the outbox
        #expect(afterStarts.works - before.works == 200)
        #expect(afterStarts.transactions - before.transactions < 50, "200 starts took \(afterStarts.transactions - before.transactions) transactions")
        #expect(afterCompletions.transactions - afterStarts.transactions < 50, "200 completions took \(afterCompletions.transactions - afterStarts.transactions) transactions")
        let completed = try await store.database.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM job WHERE status = 'completed'") }
        #expect(completed == 200)
        #expect(try await outbox().filter { $0.topic == OutboxEntry.Topic.quota && $0.kind == "commit" }.count == 200)
    }

    @Test func completionsArrivingWhileATransactionRunsShareTheNextOne() async throws {
        // Given 200 processing jobs, and a long transaction of the group committer's running,
        // so that the completions arriving meanwhile wait for it
        for index in 0..<200 { _ = try await created("job-\(index)", user: "user-\(index % 7)") }
        for index in 0..<200 { _ = try await store.start("job-\(index)", now: now) }
        let holding = Mutex(false)
        let release = DispatchSemaphore(value: 0)
        let blocker = Task { [store] in
            try await store.database.write { _ in
                holding.withLock { $0 = true }
                release.wait()
            }
        }
        try await waitUntil { holding.withLock { $0 } }
        let before = store.writeStatistics
        // When all 200 complete at once
        let completions = Task { [store, now] in
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<200 {
                    group.addTask {
                        let outcome = try await store.complete(JobAttempt(jobId: "job-\(index)", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
                        guard case .applied = outcome else { throw CancellationError() }
                    }
                }
                try await group.waitForAll()
            }
        }
        try await waitUntil { store.writeStatistics.accepted - before.accepted == 200 }
        release.signal()
        try await blocker.value
        try await completions.value
        // Then the 200 took one transaction, after the long one (counted once it ended): all
        // arrived meanwhile
        let after = store.writeStatistics
        #expect(after.works - before.works == 201)
        #expect(after.transactions - before.transactions <= 2, "200 completions took \(after.transactions - before.transactions) transactions")
        let completed = try await store.database.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM job WHERE status = 'completed'") }
        #expect(completed == 200)
    }

    @Test func aWriteThatFailsInTheDispatchersBatchLeavesTheOthers() async throws {
        // Given two queued jobs, a running one, and a row the store cannot read (an unknown status)
        for id in ["a", "b", "running"] { _ = try await created(id) }
        _ = try await store.start("running", now: now)
        _ = try await created("broken")
        try await store.database.write { db in try db.execute(sql: "UPDATE job SET status = 'lost' WHERE id = 'broken'") }
        let before = store.writeStatistics
        // When one batch starts all three queued ones and records the running one's result
        let outcome = await store.write(
            starts: ["a", "broken", "b"], results: [(JobAttempt(jobId: "running", attempt: 1), .done(JobOutput(resultKey: "r", thumbnailKey: "t")))], now: now
        )
        // Then it took one transaction, the broken start alone failed, and everything else is written
        #expect(store.writeStatistics.transactions - before.transactions == 1)
        #expect(try outcome.starts[0].get()?.status == .processing && (try? outcome.starts[1].get()) == nil && outcome.starts.count == 3)
        #expect(try outcome.starts[2].get()?.attempts == 1)
        guard case .applied(let job) = try outcome.results[0].get().0 else { Issue.record("the result was not applied"); return }
        #expect(job.status == .completed)
        for (id, status) in [("a", JobStatus.processing), ("b", .processing), ("running", .completed)] {
            #expect(try await store.job(id)?.status == status)
        }
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["commit"])
    }

    @Test func aBatchThatStartsAJobAndRecordsItsResultReadsItsOwnStart() async throws {
        // Given a queued job
        _ = try await created("quick")
        // When one batch starts it and records its first attempt's result (the batch's jobs are
        // read once as it begins)
        let outcome = await store.write(
            starts: ["quick"], results: [(JobAttempt(jobId: "quick", attempt: 1), .done(JobOutput(resultKey: "r", thumbnailKey: "t")))], now: now
        )
        // Then the result is applied to the job as the start left it, and the job is completed
        #expect(try outcome.starts[0].get()?.status == .processing)
        guard case .applied(let job) = try outcome.results[0].get().0 else { Issue.record("the result was not applied: \(outcome.results)"); return }
        #expect(job.status == .completed && job.attempts == 1)
        let stored = try await store.job("quick")
        #expect(stored?.status == .completed && stored?.attempts == 1 && stored?.resultKey == "r")
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["commit"])
    }

    @Test(arguments: JobsBackend.allCases) func staleAttemptsResultIsRefused(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.staleAttemptsResultIsRefused() }
    }

    @Test(arguments: JobsBackend.allCases) func retryableFailuresRetryUntilAttemptsRunOutThenRelease(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.retryableFailuresRetryUntilAttemptsRunOutThenRelease() }
    }

    @Test func jobsOfManyIdsAreReadInOneStatementWhateverTheIdsHold() async throws {
        // Given jobs whose ids hold what JSON escapes (the ids go to SQLite as a JSON array)
        let ids = ["plain", "with \"quotes\"", "back\\slash", "line\nbreak", "é and 😀", "tab\there", "\u{01}"]
        for id in ids { _ = try await created(id) }
        // When they are read together with ids that have no job
        let read = try await store.jobs(ids + ["missing", "also \"missing\""])
        // Then each job is read once, and nothing else
        #expect(Set(read.map(\.id)) == Set(ids) && read.count == ids.count)
        let array = JobRows.jsonArray(ids)
        #expect(try JSONDecoder().decode([String].self, from: Data(array.utf8)) == ids)
    }

    @Test func rowsWrittenByHandReadBackAsRecordsAndTheOtherWayRound() async throws {
        // Given one job written as a GRDB record (as rows from before were) and one by JobRows,
        // with every optional field set and dates with milliseconds (exact in binary, so equal after the round trip)
        let stamp = Date(timeIntervalSince1970: 1_800_000_000.125)
        var byRecord = JobRecord(
            id: "rec", userId: "u", isPro: true, imageKey: "uploads/u/a.jpg", effectId: "blur", parameters: ["sigma": 2.5, "a": 1],
            prompt: "a cat", status: .processing, progress: 0.5, attempts: 2, maxAttempts: 3, lastError: "busy", resultKey: "r",
            thumbnailKey: "t", createdAt: stamp, updatedAt: stamp.addingTimeInterval(1), startedAt: stamp.addingTimeInterval(2),
            finishedAt: stamp.addingTimeInterval(3), version: 7, cancelRequested: true, imageETag: "\"e1\""
        )
        let original = byRecord
        try await store.database.write { db in try original.insert(db) }
        // Then JobRows reads it as it was
        #expect(try await store.job("rec") == byRecord)
        // And a state change written by JobRows reads back the same through GRDB's record
        byRecord.status = .completed
        byRecord.finishedAt = stamp.addingTimeInterval(9)
        _ = try await store.cancel("rec", userId: "u", now: stamp)
        let read = try await store.database.read { db in try JobRecord.fetchOne(db, key: "rec") }
        #expect(read?.parameters == ["sigma": 2.5, "a": 1] && read?.createdAt == stamp && read?.cancelRequested == true)
        // And a job created by JobRows reads back the same through GRDB's record, and as
        // history's event
        _ = try await store.create(CreateJob(jobId: "new", userId: "u", isPro: false, imageKey: "uploads/u/a.jpg", effectId: "copy", imageETag: "\"e2\""),
                                   effectId: "copy", parameters: ["x": 1], now: stamp)
        let created = try await store.database.read { db in try JobRecord.fetchOne(db, key: "new") }
        #expect(created?.parameters == ["x": 1] && created?.createdAt == stamp && created?.status == .queued && created?.imageETag == "\"e2\"")
        let due = try await JobsHistoryFeed(store: store).due(now: stamp.addingTimeInterval(1), limit: 10)
        #expect(due.compactMap { if case .historyEvent(let event) = $0.kind, event.job.id == "new" { event.job } else { nil } } == [created])
    }

    @Test func historyEventsWaitingInTheOutboxBeforeTheMoveToRowsAreDeliveredFromTheRows() async throws {
        // Given a database of the version before (v6) with a job whose events history has not
        // had yet, and one whose events it had
        let queue = try DatabaseQueue()
        try JobsDatabase.migrator.migrate(queue, upTo: "v6: the trace a job was created in")
        let stamp = Date(timeIntervalSince1970: 1_800_000_000)
        try await queue.write { db in
            for id in ["pending", "delivered"] {
                // The row as v6 wrote it (the record of today has columns of later versions).
                try db.execute(sql: """
                    INSERT INTO job (id, userId, isPro, imageKey, effectId, parameters, status, progress, attempts, maxAttempts, resultKey,
                                     thumbnailKey, createdAt, updatedAt, startedAt, finishedAt, version)
                    VALUES (?, 'u', 0, 'uploads/u/a.jpg', 'copy', '{}', 'completed', 1, 1, 3, 'r', 't', ?, ?, ?, ?, 3)
                    """, arguments: [id, stamp, stamp, stamp, stamp])
            }
            try db.execute(sql: "INSERT INTO outbox (topic, kind, jobId, version, payload, createdAt, nextAttemptAt) VALUES ('history', 'job', 'pending', 3, x'00', ?, ?)",
                           arguments: [stamp, stamp])
            try db.execute(sql: "INSERT INTO outbox (topic, kind, jobId, version, createdAt, nextAttemptAt) VALUES ('quota', 'commit', 'pending', 3, ?, ?)",
                           arguments: [stamp, stamp])
        }
        // When the service opens it
        let migrated = SQLiteJobsStore(database: try JobsDatabase(queue), effectTitles: ["copy": "Original"])
        // Then the job with undelivered events is due for history at its current version, the
        // other is not, and the outbox keeps only quota's entry
        let due = try await JobsHistoryFeed(store: migrated).due(now: stamp.addingTimeInterval(1), limit: 10)
        #expect(due.map(\.id) == ["3:pending"])
        #expect(try await migrated.database.read { try OutboxEntry.fetchAll($0) }.map(\.topic) == ["quota"])
        #expect(try await migrated.counts().outbox == ["quota": 1, "history": 1])
    }

    @Test(arguments: JobsBackend.allCases) func aRoundOfFailedDeliveriesIsPutBackInOneWriteEachEntryWithItsOwnBackoff(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.aRoundOfFailedDeliveriesIsPutBackInOneWriteEachEntryWithItsOwnBackoff() }
    }

    @Test(arguments: JobsBackend.allCases) func historyHearsEachJobsCurrentVersionFromItsRow(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.historyHearsEachJobsCurrentVersionFromItsRow() }
    }

    @Test(arguments: JobsBackend.allCases) func purgingARunningJobReleasesItsChargeAndRemovesItsRowAndPendingEvents(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.purgingARunningJobReleasesItsChargeAndRemovesItsRowAndPendingEvents() }
    }

    @Test(arguments: JobsBackend.allCases) func purgingKeepsAnOriginalAnotherJobUses(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.purgingKeepsAnOriginalAnotherJobUses() }
    }

    @Test(arguments: JobsBackend.allCases) func cancellingQueuedAndProcessingJobs(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.cancellingQueuedAndProcessingJobs() }
    }

    @Test(arguments: JobsBackend.allCases) func aPurgedJobWhoseSettlementIsStillQueuedAnswersHowItEnded(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.aPurgedJobWhoseSettlementIsStillQueuedAnswersHowItEnded() }
    }

    @Test(arguments: JobsBackend.allCases) func sameJobIdCreatesOnceAndOtherUsersCannotTakeIt(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { try await $0.sameJobIdCreatesOnceAndOtherUsersCannotTakeIt() }
    }

    @Test func effectParametersAreCheckedAgainstTheirSchema() throws {
        let catalog = EffectCatalog()
        #expect(try catalog.resolve("blur", parameters: [:]).1 == ["sigma": 2])
        #expect(try catalog.resolve("default", parameters: [:]).0.id == "auto-enhance")
        #expect(throws: BusError.self) { try catalog.resolve("blur", parameters: ["sigma": 500]) }
        #expect(throws: BusError.self) { try catalog.resolve("blur", parameters: ["radius": 1]) }
        #expect(throws: BusError.self) { try catalog.resolve("blur", parameters: ["sigma": .nan]) }
        #expect(throws: BusError.self) { try catalog.resolve("nope", parameters: [:]) }
    }
}

/// The bodies of the store tests that run on both backends.
extension JobsStoreHarness {
    func staleAttemptsResultIsRefused() async throws {
        // Given attempt 1 was lost with its worker and attempt 2 now runs
        _ = try await created()
        let first = try #require(try await store.start("job-1", now: now))
        _ = try await store.requeue(JobAttempt(jobId: "job-1", attempt: first.attempts), reason: "worker lost", now: now)
        let second = try #require(try await store.start("job-1", now: now))
        #expect(second.attempts == 2)
        // When attempt 1 reports done late
        let late = try await store.complete(JobAttempt(jobId: "job-1", attempt: 1), output: JobOutput(resultKey: "r1", thumbnailKey: "t1"), now: now)
        // Then it is refused and changes nothing; attempt 2's result is accepted
        guard case .refused = late else { Issue.record("a stale attempt's result was applied"); return }
        #expect(try await store.job("job-1", userId: nil)?.status == .processing)
        let current = try await store.complete(JobAttempt(jobId: "job-1", attempt: 2), output: JobOutput(resultKey: "r2", thumbnailKey: "t2"), now: now)
        guard case .applied(let job) = current else { Issue.record("the current attempt was refused"); return }
        #expect(job.status == .completed && job.resultKey == "r2")
        // And quota hears one commit
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["commit"])
    }

    func retryableFailuresRetryUntilAttemptsRunOutThenRelease() async throws {
        _ = try await created()
        for attempt in 1...3 {
            _ = try #require(try await store.start("job-1", now: now))
            let (outcome, retryAfter) = try await store.fail(JobAttempt(jobId: "job-1", attempt: attempt), error: "timeout \(attempt)", retryable: true, now: now)
            guard case .applied(let job) = outcome else { Issue.record("refused"); return }
            if attempt < 3 {
                #expect(job.status == .queued)
                #expect(retryAfter == .milliseconds(10 * (1 << (attempt - 1))))
            } else {
                #expect(job.status == .failed)
                #expect(job.lastError == "timeout 3")
                #expect(retryAfter == nil)
            }
        }
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["release"])
    }

    func aRoundOfFailedDeliveriesIsPutBackInOneWriteEachEntryWithItsOwnBackoff() async throws {
        // Given three jobs cancelled while queued (a release of quota each) and their events for
        // history, with both receivers down
        for index in 1...3 {
            _ = try await created("job-\(index)")
            _ = try await store.cancel("job-\(index)", userId: "alice", now: now)
        }
        func failedRound<Box: Outbox>(_ outbox: Box) async throws -> (delivered: Int, retried: Int) {
            try await OutboxRelay("test", outbox: outbox, logger: quietLogger) { items in items.map { _ in .retry } }.relayDue(now: now.addingTimeInterval(1))
        }
        // When a round fails as a whole
        #expect(try await failedRound(settlements) == (0, 3))
        #expect(try await failedRound(history) == (0, 3))
        // Then every entry waits out its first backoff (1 s) with one attempt counted
        #expect(try await settlements.due(now: now.addingTimeInterval(1.5), limit: 10).isEmpty)
        #expect(try await history.due(now: now.addingTimeInterval(1.5), limit: 10).isEmpty)
        let items = try await settlements.due(now: now.addingTimeInterval(2.5), limit: 10)
        #expect(items.map(\.attempts) == [1, 1, 1])
        #expect(try await history.due(now: now.addingTimeInterval(2.5), limit: 10).map(\.attempts) == [1, 1, 1])
        // And entries put back together keep their own counts and times
        try await settlements.retry(items.enumerated().map { index, item in
            OutboxRetry(id: item.id, attempts: 5 + index, at: now.addingTimeInterval(Double(10 * (index + 1))))
        })
        let rows = try await outbox().filter { $0.topic == "quota" }
        #expect(rows.map(\.attempts) == [5, 6, 7])
        #expect(zip(rows, [10.0, 20, 30]).allSatisfy { abs($0.nextAttemptAt.timeIntervalSince(now) - $1) < 0.01 }, "\(rows.map(\.nextAttemptAt))")
    }

    func historyHearsEachJobsCurrentVersionFromItsRow() async throws {
        // A created job is due for history, as it is
        _ = try await created()
        var due = try await dueForHistory()
        #expect(due.map(\.event.job.version) == [1] && due.first?.event.job.status == .queued)
        let first = try #require(due.first?.id)
        // A change before the delivery is acknowledged: one event, of the current version
        _ = try await store.start("job-1", now: now)
        due = try await dueForHistory()
        #expect(due.map(\.event.job.version) == [2] && due.first?.event.job.status == .processing)
        // Acknowledging the older version leaves the newer one due (looked at past the claim
        // PostgreSQL's relays take on what they read); acknowledging it clears it
        try await history.acknowledge([first])
        #expect(try await dueForHistory(at: now.addingTimeInterval(40)).map(\.event.job.version) == [2])
        try await history.acknowledge(due.map(\.id))
        #expect(try await dueForHistory().isEmpty)
        // The next change is due again, with the effect's title
        _ = try await store.complete(JobAttempt(jobId: "job-1", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
        due = try await dueForHistory()
        #expect(due.map(\.event.job.version) == [3] && due.first?.event.job.status == .completed && due.first?.event.effectTitle == "Original")
        #expect(try await store.counts().outbox["history"] == 1)
        // A failed delivery waits out its backoff, its attempts counted
        try await history.retry([OutboxRetry(id: try #require(due.first?.id), attempts: 1, at: now.addingTimeInterval(60))])
        #expect(try await dueForHistory().isEmpty)
        let later = try await history.due(now: now.addingTimeInterval(61), limit: 10)
        #expect(later.map(\.attempts) == [1])
        try await history.acknowledge(later.map(\.id))
        #expect(try await store.counts().outbox["history"] == 0)
        // A cancel asked of a running job is not a state change: nothing is due until it ends
        _ = try await created("job-2")
        _ = try await store.start("job-2", now: now)
        try await history.acknowledge(try await dueForHistory().map(\.id))
        _ = try await store.cancel("job-2", userId: "alice", now: now)
        #expect(try await dueForHistory().isEmpty)
        _ = try await store.cancelled(JobAttempt(jobId: "job-2", attempt: 1), now: now)
        #expect(try await dueForHistory().map { "\($0.event.job.id) \($0.event.job.status)" } == ["job-2 cancelled"])
    }

    func purgingARunningJobReleasesItsChargeAndRemovesItsRowAndPendingEvents() async throws {
        // Given a processing job
        _ = try await created()
        _ = try await store.start("job-1", now: now)
        #expect(try await dueForHistory().map(\.event.job.id) == ["job-1"])
        // When it is purged
        let purge = try await store.purge("job-1", userId: "alice", now: now)
        // Then it was there, its charge is released, and nothing of it is left but the deletions
        #expect(purge.job?.status == .processing)
        #expect(try await store.job("job-1", userId: nil) == nil)
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["release"])
        #expect(try await dueForHistory().isEmpty)
        #expect(try await discarded() == ["uploads/x/y.jpg"])
        // And purging again, or someone else's job, finds nothing
        #expect(try await store.purge("job-1", userId: "alice", now: now).job == nil)
    }

    func purgingKeepsAnOriginalAnotherJobUses() async throws {
        _ = try await created("first", imageKey: "uploads/x/shared.jpg")
        _ = try await created("second", imageKey: "uploads/x/shared.jpg")
        _ = try await store.start("first", now: now)
        _ = try await store.complete(JobAttempt(jobId: "first", attempt: 1), output: JobOutput(resultKey: "results/first/1.jpg", thumbnailKey: "thumbnails/first/1.jpg"), now: now)
        #expect(try await store.purge("second", userId: "bob", now: now).job == nil)
        _ = try await store.purge("first", userId: "alice", now: now)
        #expect(try await discarded() == ["results/first/1.jpg", "thumbnails/first/1.jpg"])
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["commit"])
        _ = try await store.purge("second", userId: "alice", now: now)
        #expect(try await discarded().last == "uploads/x/shared.jpg")
    }

    func cancellingQueuedAndProcessingJobs() async throws {
        _ = try await created("queued-job")
        let cancelled = try await store.cancel("queued-job", userId: "alice", now: now)
        #expect(cancelled.status == .cancelled)
        _ = try await created("running-job")
        _ = try await store.start("running-job", now: now)
        let marked = try await store.cancel("running-job", userId: "alice", now: now)
        #expect(marked.status == .processing && marked.cancelRequested)
        _ = try await store.cancelled(JobAttempt(jobId: "running-job", attempt: 1), now: now)
        #expect(try await store.job("running-job", userId: nil)?.status == .cancelled)
        #expect(try await outbox().filter { $0.topic == "quota" }.map(\.kind) == ["release", "release"])
        // Someone else's id is not found; a finished job cannot be cancelled.
        await #expect(throws: BusError.self) { _ = try await store.cancel("running-job", userId: "mallory", now: now) }
        _ = try await created("done-job")
        _ = try await store.start("done-job", now: now)
        _ = try await store.complete(JobAttempt(jobId: "done-job", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
        do {
            _ = try await store.cancel("done-job", userId: "alice", now: now)
            Issue.record("a completed job was cancelled")
        } catch let error as BusError {
            #expect(error.code == Jobs.ErrorCode.alreadyFinished)
        }
    }

    func sameJobIdCreatesOnceAndOtherUsersCannotTakeIt() async throws {
        let first = try await created()
        let again = try await store.create(CreateJob(jobId: "job-1", userId: "alice", isPro: false, imageKey: "k", effectId: "copy"), effectId: "copy", parameters: [:], now: now)
        #expect(!again.created && again.job.id == first.id && again.job.version == first.version)
        await #expect(throws: BusError.self) {
            _ = try await store.create(CreateJob(jobId: "job-1", userId: "bob", isPro: false, imageKey: "k", effectId: "copy"), effectId: "copy", parameters: [:], now: now)
        }
        // The version of the image a job was created from is kept with it (read back by id)
        let pinned = try await store.create(CreateJob(jobId: "job-2", userId: "alice", isPro: false, imageKey: "k", effectId: "copy", imageETag: "\"v1\""),
                                            effectId: "copy", parameters: [:], now: now)
        #expect(pinned.job.imageETag == "\"v1\"")
        #expect(try await store.job("job-2", userId: "alice")?.imageETag == "\"v1\"")
    }

    func aPurgedJobWhoseSettlementIsStillQueuedAnswersHowItEnded() async throws {
        // Given a completed job, deleted by its user (purged) before its commit reached quota
        _ = try await created("done")
        _ = try await store.start("done", now: now)
        _ = try await store.complete(JobAttempt(jobId: "done", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
        _ = try await store.purge("done", userId: "alice", now: now)
        // and a running one, purged too (its charge given back)
        _ = try await created("running")
        _ = try await store.start("running", now: now)
        _ = try await store.purge("running", userId: "alice", now: now)
        // When quota asks about them (its reservations look stale), they answer how they ended,
        // so quota commits the one and releases the other, as the queued settlements will
        #expect(try await store.lookup("done", abandonIfAbsent: true, now: now) == .completed)
        #expect(try await store.lookup("running", abandonIfAbsent: true, now: now) == .failed)
        // And an id that never was a job is abandoned: its creation, arriving late, fails
        #expect(try await store.lookup("never", abandonIfAbsent: true, now: now) == nil)
        await #expect(throws: BusError.self) { _ = try await self.created("never") }
    }
}
