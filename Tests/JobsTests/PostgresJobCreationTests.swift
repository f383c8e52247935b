import Foundation
import JobsCore
@testable import JobsService
import Messages
import PostgresNIO
import Storage
import Testing
import TestSupport

/// Job creations on PostgreSQL are group-committed: those that arrive while a batch is in the
/// database are made together. These hold that each creation still answers as if alone.
@Suite("Job creations on PostgreSQL, in batches", .timeLimit(.minutes(5)))
struct PostgresJobCreationTests {
    let now = Date(timeIntervalSince1970: 1_790_000_000.25)

    func withStore<T>(_ body: (PostgresJobsStore) async throws -> T) async throws -> T {
        let location = try await TestPostgres.freshDatabase()
        try await PostgresPool.migrate(location, service: "jobs", PostgresJobsStore.migrations, logger: quietLogger)
        return try await TestPostgres.withDatabase(location) { database in
            try await body(PostgresJobsStore(database: database, retry: RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10)), logger: quietLogger))
        }
    }

    func request(_ id: String, user: String = "alice") -> CreateJob {
        CreateJob(jobId: id, userId: user, isPro: false, imageKey: "uploads/\(user)/\(id).jpg", effectId: "copy")
    }

    @Test func manyCreationsAtOnceShareFewTransactionsAndEachIdIsMadeOnce() async throws {
        try await withStore { store in
            // 100 ids, each asked for twice at the same moment (a client's retry)
            let outcomes = try await withThrowingTaskGroup(of: (String, Bool).self) { group in
                for index in 0..<200 {
                    let id = "job-\(index % 100)"
                    group.addTask { (id, try await store.create(request(id), effectId: "copy", parameters: [:], now: now).created) }
                }
                return try await group.reduce(into: [String: [Bool]]()) { $0[$1.0, default: []].append($1.1) }
            }
            #expect(outcomes.count == 100)
            for (id, created) in outcomes {
                #expect(created.count == 2 && created.filter { $0 }.count == 1, "\(id): \(created)")
            }
            #expect(try await store.jobs(outcomes.keys.sorted()).count == 100)
            let statistics = store.creations.statistics
            #expect(statistics.operations == 200)
            #expect(statistics.batches < 100, "200 creations took \(statistics.batches) batches")
        }
    }

    @Test func aRowMadeInABatchReadsBackAsTheJobItsCreationAnswered() async throws {
        try await withStore { store in
            var full = request("full")
            full.prompt = "make it \"golden\" \u{1F305}"
            full.traceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            full.imageETag = "\"9b2cf535f27731c974343645a3985328\""
            full.credits = 5
            full.isPro = true
            let fullRequest = full
            async let first = store.create(fullRequest, effectId: "copy", parameters: ["strength": 0.25, "angle": -12.5], now: now)
            async let second = store.create(request("bare", user: "bob"), effectId: "copy", parameters: [:], now: now)
            let made = try await [first.job, second.job]
            for job in made {
                let read = try #require(try await store.job(job.id, userId: nil))
                #expect(read == job)
            }
            #expect(made[0].prompt == full.prompt && made[0].imageETag == full.imageETag && made[0].credits == 5)
            #expect(made[1].prompt == nil && made[1].traceParent == nil && made[1].imageETag == nil)
            // And each is due for history at once.
            let due = try await PostgresJobsHistoryFeed(store: store).due(now: now.addingTimeInterval(1), limit: 10)
            #expect(Set(due.map(\.jobId)) == ["full", "bare"])
        }
    }

    @Test func aBatchAnswersEachCreationItsOwnRefusal() async throws {
        try await withStore { store in
            _ = try await store.create(request("taken", user: "alice"), effectId: "copy", parameters: [:], now: now)
            #expect(try await store.lookup("gone", abandonIfAbsent: true, now: now) == nil)
            let batch = [
                PostgresJobsStore.Creation(request: request("taken", user: "mallory"), effectId: "copy", parameters: [:], now: now),
                PostgresJobsStore.Creation(request: request("gone"), effectId: "copy", parameters: [:], now: now),
                PostgresJobsStore.Creation(request: request("new"), effectId: "copy", parameters: [:], now: now),
                PostgresJobsStore.Creation(request: request("new", user: "mallory"), effectId: "copy", parameters: [:], now: now),
            ]
            let results = try await PostgresJobsStore.create(batch, database: store.database, retry: store.retry, logger: quietLogger)
            func code(_ index: Int) -> BusError.Code? {
                if case .failure(let error as BusError) = results[index] { return error.code }
                return nil
            }
            #expect(code(0) == .conflict)
            #expect(code(1) == Jobs.ErrorCode.abandoned)
            if case .success(let created) = results[2] { #expect(created.created) } else { Issue.record("\(results[2])") }
            #expect(code(3) == .conflict)
            #expect(try await store.job("gone", userId: nil) == nil)
            #expect(try await store.job("new", userId: nil)?.userId == "alice")
        }
    }

    /// A batch of creations is one call of `jobs_create`, planned once per connection: planned
    /// while the tables held a row, the kept plan would read them whole at every batch once they
    /// held thousands, but the function plans without sequential scans.
    @Test func aBatchProbesByKeyAfterTheTablesGrowPastThePlanMadeWhenTheyWereSmall() async throws {
        try await withStore { store in
            @Sendable func call(_ db: PostgresConnection, _ ids: [String]) async throws -> [(JobRecord?, String?)] {
                let jobs = ids.map { id in
                    JobRecord(
                        id: id, userId: "alice", isPro: false, imageKey: "uploads/alice/\(id).jpg", effectId: "copy", parameters: [:], prompt: nil,
                        status: .queued, progress: 0, attempts: 0, maxAttempts: 3, lastError: nil, resultKey: nil, thumbnailKey: nil, createdAt: now,
                        updatedAt: now, startedAt: nil, finishedAt: nil, version: 1, credits: 1, traceParent: nil, imageETag: nil
                    )
                }
                var rows: [(JobRecord?, String?)] = []
                let statement = PostgresJobsStore.CreateJobs(ids: ids, rows: try JobRowsJSON.new(jobs))
                for try await row in try await db.execute(statement, logger: quietLogger) { rows.append(row) }
                return rows
            }
            try await store.database.connection { db in
                // Given a connection that made a batch while the tables held a row each
                #expect(try await store.lookup("gone", abandonIfAbsent: true, now: now) == nil)
                #expect(try await call(db, ["first"]).isEmpty)
                try await KeptPlanSteps.keepStatistics(db, of: ["jobs_job", "jobs_abandoned"])
                // And tables that then grew to 3,000 rows
                try await KeptPlanSteps.addJobs(db, status: "queued", attempts: 0)
                try await db.query("INSERT INTO jobs_abandoned (job_id, at) SELECT 'lost-' || g, 1790000000 FROM generate_series(1, 3000) AS g", logger: quietLogger)

                // When a batch asks for two new ids, one made already and one abandoned
                var rows: [(JobRecord?, String?)] = []
                let scans = try await TestPostgres.sequentialScans(db, of: ["jobs_job", "jobs_abandoned"], logger: quietLogger) {
                    rows = try await call(db, ["new-1", "job-00042", "gone", "new-2"])
                }

                // Then it answers the one made and the one abandoned, without a scan of either table
                #expect(scans == 0, "\(scans) sequential scans of jobs_job and jobs_abandoned")
                #expect(rows.compactMap { $0.0?.id } == ["job-00042"])
                #expect(rows.compactMap(\.1) == ["gone"])
                // And made the two new ones only
                let made = try await db.all("SELECT id FROM jobs_job WHERE id IN ('new-1', 'new-2', 'gone') ORDER BY id", as: String.self, logger: quietLogger)
                #expect(made == ["new-1", "new-2"])
            }
        }
    }
}
