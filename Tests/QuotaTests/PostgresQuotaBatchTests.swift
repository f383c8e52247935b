import Bus
import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
@testable import QuotaService
@testable import Storage
import Synchronization
import Testing
import TestSupport

/// Quota on PostgreSQL decides reservations, commits and releases in batches: one transaction for
/// all that arrive while the previous batch is in the database. These hold what batching must not
/// change (exactness, one charge per job id, each operation's own answer) and that it happens.
@Suite("Quota on PostgreSQL, in batches", .timeLimit(.minutes(5)))
struct PostgresQuotaBatchTests {
    let noon = try! Date("2026-11-21T12:00:00Z", strategy: .iso8601)

    /// Fresh quota tables on the test PostgreSQL, and `replicas` stores over them (as replicas of
    /// the service are: each its own pool and batches).
    func withStores<T>(replicas: Int = 1, guests: GuestLimits = GuestLimits(), _ body: ([PostgresQuotaStore]) async throws -> T) async throws -> T {
        let location = try await TestPostgres.freshDatabase()
        var logger = Logger(label: "test.quota")
        logger.logLevel = .warning
        try await PostgresPool.migrate(location, service: "quota", PostgresQuotaStore.migrations, logger: logger)
        func open(_ stores: [PostgresQuotaStore]) async throws -> T {
            guard stores.count < replicas else { return try await body(stores) }
            return try await TestPostgres.withDatabase(location) { database in
                try await open(stores + [PostgresQuotaStore(database: database, guests: guests, logger: logger)])
            }
        }
        return try await open([])
    }

    /// Quota on a pool of one connection (fresh tables), and `other`, a session of its own holding
    /// the locks of `users` (as a replica's transaction stuck on those users would).
    func withOneConnection(lockedElsewhere users: [String], _ body: (_ store: PostgresQuotaStore, _ other: PostgresPool, Logger) async throws -> Void) async throws {
        let location = try await TestPostgres.freshDatabase()
        var logger = Logger(label: "test.quota")
        logger.logLevel = .critical
        try await PostgresPool.migrate(location, service: "quota", PostgresQuotaStore.migrations, logger: logger)
        let quiet = logger
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
            let store = PostgresQuotaStore(database: pool, logger: quiet)
            try await TestPostgres.withDatabase(location) { other in
                try await other.connection { db in
                    for user in users {
                        _ = try await db.query("SELECT pg_advisory_lock(hashtext(\("quota:user:" + user)))", logger: quiet)
                    }
                }
                try await body(store, other, quiet)
            }
        }
    }

    @Test func manyReservesAtOnceShareFewTransactionsAndAdmitExactlyTheCreditsLeft() async throws {
        try await withStores { stores in
            let store = stores[0]
            // 200 reservations of one free user (20 a day) at once
            let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<200 {
                    group.addTask { try await store.reserve(ReserveQuota(userId: "burst", jobId: "job-\(index)"), now: noon).admitted }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(admitted == 20)
            let usage = try await store.usage(userId: "burst", now: noon)
            #expect(usage.status.daily.used == 20)
            #expect(usage.charges.count == 20)
            // They were decided together, not one transaction each.
            let statistics = store.batcher.statistics
            #expect(statistics.operations == 200)
            #expect(statistics.batches < 100, "200 reservations took \(statistics.batches) batches")
        }
    }

    @Test func twoReplicasReservingTheSameUsersInOppositeOrdersNeitherDeadlockNorOverAdmit() async throws {
        try await withStores(replicas: 2) { stores in
            let users = (0..<8).map { "user-\($0)" }
            // Each replica gets 40 reservations for every user, one replica in the opposite order
            // of the other, all at once: their batches lock overlapping users.
            let admitted = try await withThrowingTaskGroup(of: (String, Bool).self) { group in
                for (replica, store) in stores.enumerated() {
                    let order = replica == 0 ? users : users.reversed()
                    for round in 0..<40 {
                        for user in order {
                            group.addTask {
                                let decision = try await store.reserve(ReserveQuota(userId: user, jobId: "\(user)-\(replica)-\(round)"), now: noon)
                                return (user, decision.admitted)
                            }
                        }
                    }
                }
                return try await group.reduce(into: [String: Int]()) { counts, outcome in
                    if outcome.1 { counts[outcome.0, default: 0] += 1 }
                }
            }
            for user in users {
                #expect(admitted[user] == 20, "\(user) was admitted \(admitted[user] ?? 0) times")
                #expect(try await stores[1].status(userId: user, now: noon).daily.used == 20)
            }
        }
    }

    @Test func oneBatchDecidesItsOperationsInOrderAsOneAtATimeWould() async throws {
        try await withStores { stores in
            let store = stores[0]
            // Nineteen credits of "ann" used before the batch.
            for index in 0..<19 {
                _ = try await store.reserve(ReserveQuota(userId: "ann", jobId: "before-\(index)"), now: noon)
            }
            // One batch, decided as given:
            let batch: [PostgresQuotaStore.Operation] = [
                .reserve(ReserveQuota(userId: "ann", jobId: "a"), now: noon),       // the 20th credit: admitted
                .reserve(ReserveQuota(userId: "ann", jobId: "b"), now: noon),       // the 21st: denied, daily
                .reserve(ReserveQuota(userId: "ann", jobId: "a"), now: noon),       // "a" again: the same admission
                .settle(jobId: "a", to: .released, now: noon),                      // gives its credit back
                .reserve(ReserveQuota(userId: "ann", jobId: "b"), now: noon),       // so "b" now fits
                .settle(jobId: "b", to: .committed, now: noon),
                .settle(jobId: "b", to: .released, now: noon),                      // refused: committed
                .reserve(ReserveQuota(userId: "mallory", jobId: "b"), now: noon),   // not hers
                .settle(jobId: "never-made", to: .committed, now: noon),            // no such charge
                .reserve(ReserveQuota(userId: "ann", jobId: "a"), now: noon),       // released "a", afresh: no room
            ]
            let results = try await PostgresQuotaStore.decide(batch, database: store.database, ledger: store.ledger, zones: store.zones, logger: store.logger)
            func decision(_ index: Int) -> QuotaDecision? {
                if case .success(.decision(let decision)) = results[index] { return decision }
                return nil
            }
            func charge(_ index: Int) -> Charge? {
                if case .success(.charge(let charge)) = results[index] { return charge }
                return nil
            }
            func code(_ index: Int) -> BusError.Code? {
                if case .failure(let error as BusError) = results[index] { return error.code }
                return nil
            }
            #expect(decision(0)?.admitted == true)
            #expect(decision(0)?.status.daily.used == 20)
            #expect(decision(1)?.admitted == false)
            #expect(decision(1)?.violated == ["daily"])
            #expect(decision(2)?.admitted == true)
            #expect(charge(3)?.state == .released)
            #expect(decision(4)?.admitted == true)
            #expect(decision(4)?.status.daily.used == 20)
            #expect(charge(5)?.state == .committed)
            #expect(code(6) == Quota.ErrorCode.chargeSettled)
            #expect(code(7) == Quota.ErrorCode.jobIdTaken)
            #expect(code(8) == .notFound)
            #expect(decision(9)?.admitted == false)
            // And the database holds what the batch said.
            let usage = try await store.usage(userId: "ann", now: noon)
            #expect(usage.status.daily.used == 20)
            #expect(usage.status.monthly.used == 20)
            let charges = Dictionary(uniqueKeysWithValues: usage.charges.map { ($0.jobId, $0) })
            #expect(charges["a"]?.state == .released)
            #expect(charges["b"]?.state == .committed)
            #expect(charges["b"]?.settledAt == noon)
        }
    }

    /// A replica makes a reservation's windows in the zone it knows its user to have; another
    /// replica may have changed it. The call checks, and the batch is decided again in the zone
    /// the user's row names.
    @Test func aReplicaToldOfAZoneSetOnAnotherDecidesInThatZone() async throws {
        try await withStores(replicas: 2) { stores in
            // 2026-11-21T12:00Z is already the 22nd at UTC+14
            let kiritimati = "Pacific/Kiritimati"
            _ = try await stores[1].setPlan(SetPlan(userId: "kai", plan: "free", timeZone: kiritimati), now: noon)
            #expect(stores[0].zones.zone(of: "kai") == nil)

            let first = try await stores[0].reserve(ReserveQuota(userId: "kai", jobId: "k1", cost: 3), now: noon)
            #expect(first.admitted)
            #expect(first.status.timeZone == kiritimati)
            #expect(first.status.daily.used == 3)
            #expect(first.status.daily.startsAt == (try Date("2026-11-21T10:00:00Z", strategy: .iso8601)))
            #expect(stores[0].zones.zone(of: "kai") == kiritimati)
            // The other replica reads the same window
            #expect(try await stores[1].status(userId: "kai", now: noon).daily.used == 3)

            // Zone cleared on the other replica: this one, still thinking Kiritimati, is told
            _ = try await stores[1].setPlan(SetPlan(userId: "kai", plan: "free", timeZone: ""), now: noon)
            let second = try await stores[0].reserve(ReserveQuota(userId: "kai", jobId: "k2", cost: 2), now: noon)
            #expect(second.status.timeZone == nil)
            #expect(second.status.daily.used == 2)
            #expect(second.status.daily.startsAt == (try Date("2026-11-21T00:00:00Z", strategy: .iso8601)))
            #expect(stores[0].zones.zone(of: "kai") == nil)
        }
    }

    /// A new job id is charged by another user's transaction after the batch read it as free:
    /// the batch's insert waits for that transaction, fails once it commits, and the batch, run
    /// again, finds the job id taken.
    @Test func aJobIdChargedElsewhereWhileTheBatchDecidedIsFoundTakenWhenItRunsAgain() async throws {
        try await withOneConnection(lockedElsewhere: []) { store, other, logger in
            try await other.connection { holder in
                // Given another user's charge of "contested", written but not yet committed
                try await holder.query("BEGIN", logger: logger)
                try await holder.query("""
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at)
                    VALUES ('contested', 'bob', 1, 'reserved', '2026-11-21', '2026-11', now())
                    """, logger: logger)
                // When ann reserves "contested", and her batch waits on that row (a batch of this
                // test's database: other tests' batches wait on locks of their own)
                async let answer: BusError.Code? = {
                    do {
                        _ = try await store.reserve(ReserveQuota(userId: "ann", jobId: "contested"), now: noon)
                        return nil
                    } catch let error as BusError {
                        return error.code
                    } catch {
                        return BusError.Code(rawValue: "\(error)")
                    }
                }()
                try await waitUntil {
                    try await other.connection { db in
                        try await db.first("""
                            SELECT count(*)::bigint FROM pg_stat_activity
                            WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%quota_batch_decide_and_commit(%'
                            """, as: Int.self, logger: logger) ?? 0
                    } > 0
                }
                try await holder.query("COMMIT", logger: logger)

                // Then she is told it is another user's, and nothing of hers was charged
                #expect(await answer == Quota.ErrorCode.jobIdTaken)
            }
            #expect(try await store.status(userId: "ann", now: noon).daily.used == 0)
        }
    }

    @Test func guestsOfANetworkReservingAtOnceShareItsCreditsExactly() async throws {
        let limit = 20
        try await withStores(replicas: 2, guests: GuestLimits(networkDaily: limit)) { stores in
            // 30 guests of one network, each wanting 2 credits at once, over two replicas: the
            // network's 20 credits a day are shared, and never exceeded.
            let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<30 {
                    let store = stores[index % 2]
                    group.addTask {
                        try await store.reserve(
                            ReserveQuota(userId: "guest-\(index)", jobId: "guest-job-\(index)", cost: 2, network: "203.0.113.0/24"), now: noon
                        ).admitted
                    }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(admitted == limit / 2)
        }
    }

    @Test func aBatchWaitingPastItsDeadlineForAUserLockedElsewhereIsStoppedByPostgreSQL() async throws {
        // Given quota on a pool of one connection, and another session holding a user's lock
        try await withOneConnection(lockedElsewhere: ["held"]) { store, _, _ in
            // When that user's reservation is made for a bus request with 2 s left
            var thrown: (any Error)?
            do {
                _ = try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(2))) {
                    try await store.reserve(ReserveQuota(userId: "held", jobId: "job-held"), now: noon)
                }
            } catch {
                thrown = error
            }
            // Then it fails in time to answer, outcome unknown
            #expect(StorageFailure.busError(for: try #require(thrown))?.code == .storageUnavailable)
            // And PostgreSQL itself gave up the batch's lock wait at that deadline (the call
            // sets it): the pool's one connection decides another user's reservation while the
            // lock is still held
            let decision = try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(20))) {
                try await store.reserve(ReserveQuota(userId: "free", jobId: "job-free"), now: noon)
            }
            #expect(decision.admitted)
        }
    }

    @Test func everyOperationOfABatchIsAnsweredBeforeItsOwnDeadlineThoughOthersHaveLaterOnes() async throws {
        // Given quota on a pool of one connection, and another session holding two users' locks
        try await withOneConnection(lockedElsewhere: ["first", "held"]) { store, other, logger in
            try await withThrowingTaskGroup(of: Void.self) { group in
                // A batch waiting for one of them keeps the only lane busy for up to 3 s
                group.addTask {
                    _ = try? await BusDeadline.$current.withValue(.now.advanced(by: .seconds(3))) {
                        try await store.reserve(ReserveQuota(userId: "first", jobId: "job-first"), now: self.noon)
                    }
                }
                while try await other.connection({ db in
                    try await db.first("SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", as: Int.self, logger: logger)
                }) == 0 {
                    try await Task.sleep(for: .milliseconds(10))
                }
                // When the other user's reservation, with 4 s left, and a third user's, with a
                // minute left, wait for the next batch together
                let deadline = ContinuousClock.now.advanced(by: .seconds(4))
                let answered = Mutex<ContinuousClock.Instant?>(nil)
                group.addTask {
                    _ = try? await BusDeadline.$current.withValue(deadline) {
                        try await store.reserve(ReserveQuota(userId: "held", jobId: "job-held"), now: self.noon)
                    }
                    answered.withLock { $0 = .now }
                }
                group.addTask {
                    _ = try? await BusDeadline.$current.withValue(.now.advanced(by: .seconds(60))) {
                        try await store.reserve(ReserveQuota(userId: "later", jobId: "job-later"), now: self.noon)
                    }
                }
                try await group.waitForAll()
                // Then the held user's is answered before its own deadline, not when the batch's
                // latest would have let PostgreSQL give up (a minute on)
                let at = try #require(answered.withLock { $0 })
                #expect(at < deadline, "answered \(at - deadline) after its deadline")
            }
        }
    }

    @Test func aBatchRunsUnderItsEarliestDeadlineButIsGivenAtLeastASecond() {
        let now = ContinuousClock.now
        func deadline(_ seconds: [Double?]) -> ContinuousClock.Instant? {
            PostgresBatcher<Int, Int>.deadline(of: seconds.map { $0.map { now.advanced(by: .milliseconds(Int($0 * 1000))) } }, now: now)
        }
        #expect(deadline([4, 60, nil]) == now.advanced(by: .seconds(4)))
        #expect(deadline([0.3, 60]) == now.advanced(by: PostgresBatcher<Int, Int>.leastTime))
        #expect(deadline([nil, nil]) == nil)
        #expect(deadline([]) == nil)
    }

    /// A connection plans the statements of `quota_batch_decide` once, from the statistics of
    /// that time (as jobs' `jobs_write_changes`, whose test this follows). Planned when the tables
    /// held a row, its reads and writes must still probe by key once they hold thousands
    /// (`TestPostgres.sequentialScans` counts).
    @Test func theBatchCallProbesByKeyAfterTheTablesGrowPastThePlanMadeWhenTheyWereSmall() async throws {
        try await withStores { stores in
            let store = stores[0]
            try await store.database.connection { db in
                let logger = Logger(label: "test.quota")
                let now = noon
                func decide(_ batch: [PostgresQuotaStore.Operation]) async throws -> [Result<PostgresQuotaStore.Outcome, any Error>] {
                    guard case .decided(let results) = try await PostgresQuotaStore.decide(
                        batch, db, timeout: nil, ledger: store.ledger, zones: store.zones, logger: logger
                    ) else {
                        Issue.record("the users' zones were not those assumed")
                        return []
                    }
                    return results
                }
                func reserve(_ users: [String], job: String) -> [PostgresQuotaStore.Operation] {
                    users.map { .reserve(ReserveQuota(userId: $0, jobId: job + $0, network: "net"), now: now) }
                }
                // Given a connection that decided batches while each table held a row
                try await db.query("INSERT INTO quota_user (id, plan, updated_at) VALUES ('user-00000', 'free', now())", logger: logger)
                try await db.query("INSERT INTO quota_guest VALUES ('user-00000', 'net', 0, 'key-0')", logger: logger)
                // (autovacuum off for them: an ANALYZE of the grown tables would have the call planned
                // again, and the test pass without its fix)
                for table in ["quota_user", "quota_usage", "quota_charge", "quota_guest"] {
                    try await db.query(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) SET (autovacuum_enabled = false)"), logger: logger)
                }
                try await db.query("INSERT INTO quota_usage VALUES ('user-00000', 'daily', '2026-11-21', 1)", logger: logger)
                try await db.query("""
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at)
                    VALUES ('job-user-00000', 'user-00000', 1, 'reserved', '2026-11-21', '2026-11', now())
                    """, logger: logger)
                for table in ["quota_user", "quota_usage", "quota_charge", "quota_guest"] {
                    try await db.query(PostgresQuery(unsafeSQL: "ANALYZE \(table)"), logger: logger)
                }
                for round in 0..<6 {
                    _ = try await decide(reserve(["user-00000"], job: "warm-\(round)-") + [.settle(jobId: "warm-\(round)-user-00000", to: .released, now: now)])
                }
                // And tables that then grew to 3,000 users, each with its windows, a charge and a guest row
                try await db.query("""
                    INSERT INTO quota_user (id, plan, updated_at) SELECT 'user-' || lpad(g::text, 5, '0'), 'free', now()
                    FROM generate_series(1, 3000) AS g
                    """, logger: logger)
                try await db.query("""
                    INSERT INTO quota_usage SELECT id, k, CASE k WHEN 'daily' THEN '2026-11-21' ELSE '2026-11' END, 1
                    FROM quota_user CROSS JOIN (VALUES ('daily'), ('monthly')) AS w(k) WHERE id <> 'user-00000'
                    """, logger: logger)
                try await db.query("""
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at)
                    SELECT 'job-' || id, id, 1, 'reserved', '2026-11-21', '2026-11', now() FROM quota_user WHERE id <> 'user-00000'
                    """, logger: logger)
                try await db.query("INSERT INTO quota_guest SELECT id, 'net', 0, 'key-' || id FROM quota_user WHERE id <> 'user-00000'", logger: logger)

                // When one batch reserves for ten users and releases ten other users' charges
                let others = (11...20).map { "user-000\($0)" }
                var results: [Result<PostgresQuotaStore.Outcome, any Error>] = []
                let scans = try await TestPostgres.sequentialScansAcrossCommits(db, of: ["quota_user", "quota_usage", "quota_charge", "quota_guest"], logger: logger) {
                    results = try await decide(
                        reserve((1...10).map { "user-0000\($0 - 1)" }, job: "new-") + others.map { .settle(jobId: "job-" + $0, to: .released, now: now) }
                    )
                }

                // Then no table was scanned whole, every reservation was admitted, every release
                // gave its credit back
                #expect(scans == 0, "\(scans) sequential scans of the quota tables")
                #expect(results.count == 20)
                for result in results.prefix(10) {
                    guard case .success(.decision(let decision)) = result else { Issue.record("\(result)"); continue }
                    #expect(decision.admitted)
                }
                #expect(try await db.first(
                    "SELECT sum(used)::bigint FROM quota_usage WHERE user_id = ANY(\(others)::text[])", as: Int.self, logger: logger
                ) == 0)
            }
        }
    }
}
