import Foundation
import GRDB
import Messages
import QuotaCore
@testable import QuotaService
import Storage
import Testing
import TestSupport

@Suite("The quota ledger's log", .timeLimit(.minutes(5)))
struct QuotaLogTests {
    static func change(_ seq: UInt64, job: String = "job", network: String? = nil, settled: Bool = false) -> LedgerChange {
        LedgerChange(
            seq: seq, jobId: job, userId: "device:Ünïcode-user", cost: 4, state: settled ? .committed : .reserved,
            dayKey: "2026-11-25", monthKey: "2026-11", network: network, reservedAt: 1_795_000_123.456, settledAt: settled ? 1_795_000_200.5 : nil,
            usage: [LedgerChange.Usage(counter: UsageCounter(owner: "device:Ünïcode-user", window: "daily", key: "2026-11-25"), used: 12)]
        )
    }

    @Test func crc32IsZlibs() {
        // The check value every CRC-32 (IEEE) implementation publishes for "123456789".
        let value = Array("123456789".utf8).withUnsafeBytes { CRC32.checksum($0) }
        #expect(value == 0xCBF4_3926)
    }

    @Test func framesReadBackAsWrittenAndStopAtATornOrDamagedOne() {
        var bytes: [UInt8] = []
        let changes = [Self.change(1), Self.change(2, job: "other", network: "203.0.113.0/24", settled: true), Self.change(3)]
        for change in changes { LedgerFrame.append(change, to: &bytes) }
        let read = bytes.withUnsafeBytes { LedgerFrame.read($0) }
        #expect(read.changes == changes)
        #expect(read.validBytes == bytes.count)
        // Every cut inside the last frame reads the first two and stops where the third began
        var secondEnds = 0
        do {
            var two: [UInt8] = []
            for change in changes.prefix(2) { LedgerFrame.append(change, to: &two) }
            secondEnds = two.count
        }
        for cut in secondEnds..<bytes.count {
            let torn = Array(bytes.prefix(cut)).withUnsafeBytes { LedgerFrame.read($0) }
            #expect(torn.changes == Array(changes.prefix(2)), "cut at \(cut)")
            #expect(torn.validBytes == secondEnds)
        }
        // A flipped bit anywhere in the second frame ends the log after the first
        var flips = 0
        for index in (bytes.count - (bytes.count - secondEnds) * 2)..<secondEnds {
            var damaged = bytes
            damaged[index] ^= 0x10
            let read = damaged.withUnsafeBytes { LedgerFrame.read($0) }
            #expect(read.changes == [changes[0]], "flip at \(index)")
            flips += 1
        }
        #expect(flips > 50)
    }

    @Test func aGrantsNegativeCostAndUsageReadBackAsWritten() {
        var grant = Self.change(1, job: "grant:support-1", settled: true)
        grant.cost = -10
        grant.usage = [LedgerChange.Usage(counter: UsageCounter(owner: "device:Ünïcode-user", window: "daily", key: "2026-11-25"), used: -7)]
        var bytes: [UInt8] = []
        LedgerFrame.append(grant, to: &bytes)
        #expect(bytes.withUnsafeBytes { LedgerFrame.read($0) }.changes == [grant])
    }

    @Test func garbageReadsAsNoChangesAndNeverTraps() {
        var generator = SystemRandomNumberGenerator()
        for size in 0..<2000 {
            let garbage = (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
            #expect(garbage.withUnsafeBytes { LedgerFrame.read($0) }.changes.isEmpty)
        }
    }
}

@Suite("The quota ledger's memory, log and checkpoints", .serialized, .timeLimit(.minutes(5)))
struct QuotaMemoryLedgerTests {
    /// Opens the database in `folder` as the service does.
    static func open(_ folder: URL, guests: GuestLimits = GuestLimits()) throws -> QuotaDatabase {
        try QuotaDatabase.open(path: folder.appendingPathComponent("quota.sqlite").path, guests: guests)
    }

    static func folder() throws -> URL {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("quota-ledger-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        return folder
    }

    /// A mix of reserves (some over the limit, some on a shared guest network, over two days),
    /// commits and releases, for 12 users; the users.
    static func workload(_ store: QuotaDatabase, seed: UInt64, start: Date) async throws -> [String] {
        var random = SplitMix64(state: seed)
        let users = (0..<12).map { "user-\($0)" }
        var reserved: [String] = []
        for step in 0..<600 {
            let now = start.addingTimeInterval(Double(step) * 150)  // 600 steps: about a day
            let user = users[Int(random.next() % UInt64(users.count))]
            switch random.next() % 10 {
            case 0..<6:
                let job = "job-\(seed)-\(step)"
                let network = random.next() % 3 == 0 ? "198.51.100.0/24" : nil
                let decision = try await store.reserve(ReserveQuota(userId: user, jobId: job, cost: 1 + Int(random.next() % 4), network: network), now: now)
                if decision.admitted { reserved.append(job) }
            case 6..<8:
                if let job = reserved.popLast() { _ = try await store.commit(jobId: job, now: now) }
            default:
                if !reserved.isEmpty { _ = try await store.release(jobId: reserved.remove(at: Int(random.next() % UInt64(reserved.count))), now: now) }
            }
        }
        return users
    }

    static func snapshot(_ store: QuotaDatabase, _ users: [String], at now: Date) async throws -> [String: [Int]] {
        var statuses: [String: [Int]] = [:]
        for user in users {
            let status = try await store.status(userId: user, now: now)
            statuses[user] = [status.daily.used, status.monthly.used]
        }
        return statuses
    }

    /// Whether the tables agree with themselves: each usage counter is the sum of the costs of the
    /// charges in its window that were not released (every usage row here began at zero).
    static func tablesAgree(_ store: QuotaDatabase) async throws -> (Bool, charges: Int) {
        try await store.read { db in
            let disagreeing = try Int.fetchOne(db, sql: """
                SELECT count(*) FROM usage u WHERE used != coalesce((
                    SELECT sum(cost) FROM charge c WHERE c.state != 'released' AND (
                        (u.window = 'daily' AND c.dayKey = u.windowKey AND (c.userId = u.userId OR 'net:' || c.network = u.userId))
                        OR (u.window = 'monthly' AND c.monthKey = u.windowKey AND c.userId = u.userId))), 0)
                """) ?? -1
            return (disagreeing == 0, try Int.fetchOne(db, sql: "SELECT count(*) FROM charge") ?? 0)
        }
    }

    @Test func aRestartAppliesTheLogsTailAndRebuildsMemoryExactly() async throws {
        let folder = try Self.folder()
        defer { try? FileManager.default.removeItem(at: folder) }
        // Over the last two days or so: windows memory holds whole since the start (UTC yesterday
        // on) and older ones it reads
        let end = Date()
        let start = end.addingTimeInterval(-2 * 600 * 150)
        let guests = GuestLimits(perNetworkHour: 30, networkDaily: 25)
        // Given a store whose tables caught up with a first workload
        let first = try Self.open(folder, guests: guests)
        let users = try await Self.workload(first, seed: 1, start: start)
        _ = try await first.usage(userId: users[0], now: end)  // returns once the tables hold everything
        let (_, chargesBefore) = try await Self.tablesAgree(first)
        // And a second workload that only the log holds when the process stops (its checkpoints
        // held back, as if it were killed before they ran)
        first.engine.checkpointer.pause()
        _ = try await Self.workload(first, seed: 2, start: start.addingTimeInterval(600 * 150))
        #expect(try await first.reserve(ReserveQuota(userId: "tail-user", jobId: "tail-job", cost: 3), now: end).admitted)
        #expect(first.engine.checkpointer.backlog > 100)
        let expected = try await Self.snapshot(first, users + ["tail-user"], at: end)
        #expect(try await Self.tablesAgree(first).charges == chargesBefore)

        // When the store is opened again on the same files
        let reopened = try Self.open(folder, guests: guests)
        // Then every user's windows are as they were, from memory rebuilt from the tables the
        // log's tail was applied to
        #expect(try await Self.snapshot(reopened, users + ["tail-user"], at: end) == expected)
        let (agree, charges) = try await Self.tablesAgree(reopened)
        #expect(agree)
        #expect(charges > chargesBefore)
        // And the segments replayed are gone, a new one begun
        let segments = try FileManager.default.contentsOfDirectory(atPath: folder.appendingPathComponent("quota.sqlite-ledger").path)
        #expect(segments.count == 1)
        // And a charge from the tail settles as any other, and a re-sent reserve charges nothing more
        let tailJob = try #require(try await reopened.usage(userId: "tail-user", now: end).charges.first)
        #expect(tailJob.jobId == "tail-job" && tailJob.state == .reserved && tailJob.cost == 3)
        #expect(try await reopened.commit(jobId: tailJob.jobId, now: end).state == .committed)
        let before = try await reopened.status(userId: tailJob.userId, now: tailJob.reservedAt)
        #expect(before.daily.used == 3)
        _ = try await reopened.reserve(ReserveQuota(userId: tailJob.userId, jobId: tailJob.jobId, cost: tailJob.cost), now: tailJob.reservedAt)
        #expect(try await reopened.status(userId: tailJob.userId, now: tailJob.reservedAt) == before)
    }

    @Test func memoryKnowsEveryJobIdTheTablesHoldAcrossARestartAndForgetsThoseForgotten() async throws {
        let folder = try Self.folder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let noon = try Date("2026-11-21T12:00:00Z", strategy: .iso8601)
        // Given charges of gateway-made (UUID) and other job ids, settled or not
        let first = try Self.open(folder)
        let uuids = (0..<5).map { _ in UUID().uuidString.lowercased() }
        for (index, jobId) in (uuids + ["job-a", "JOB-A", uuids[0].uppercased()]).enumerated() {
            #expect(try await first.reserve(ReserveQuota(userId: "kim", jobId: jobId), now: noon).replayed == nil)
            if index % 2 == 0 { _ = try await first.commit(jobId: jobId, now: noon) }
        }
        #expect(try await first.knownJobIds() == 8)
        _ = try await first.usage(userId: "kim", now: noon)
        await first.close()
        // When the store is opened again
        let reopened = try Self.open(folder)
        // Then memory knows each id again (ids differing only in case are different ids), and
        // each sent again is answered again, charging nothing
        #expect(try await reopened.knownJobIds() == 8)
        for jobId in uuids + ["job-a", "JOB-A", uuids[0].uppercased()] {
            #expect(try await reopened.reserve(ReserveQuota(userId: "kim", jobId: jobId), now: noon).replayed == true, "\(jobId)")
        }
        #expect(try await reopened.status(userId: "kim", now: noon).daily.used == 8)
        // And after the settled ones are forgotten, memory forgets them too: sent again, they
        // are new charges, while the reservations kept are still answered again
        #expect(try await reopened.forget(settledBefore: noon.addingTimeInterval(1), limit: 100) == 4)
        #expect(try await reopened.knownJobIds() == 4)
        #expect(try await reopened.reserve(ReserveQuota(userId: "kim", jobId: uuids[0]), now: noon).replayed == nil)
        #expect(try await reopened.reserve(ReserveQuota(userId: "kim", jobId: uuids[1]), now: noon).replayed == true)
        #expect(try await reopened.knownJobIds() == 5)
        #expect(try await reopened.status(userId: "kim", now: noon).daily.used == 9)
    }

    @Test func anIdChargedAgainAfterTheTablesViewIsNotForgottenByMemory() async throws {
        let store = try QuotaDatabase.inMemory()
        let noon = try Date("2026-11-21T12:00:00Z", strategy: .iso8601)
        // Given a settled charge the tables hold (applied through its sequence number)
        _ = try await store.reserve(ReserveQuota(userId: "lee", jobId: "job-1"), now: noon)
        _ = try await store.release(jobId: "job-1", now: noon)
        _ = try await store.usage(userId: "lee", now: noon)
        let applied = store.engine.checkpointer.appliedSeq
        // And the same id charged again since (a change after that view)
        _ = try await store.reserve(ReserveQuota(userId: "lee", jobId: "job-1"), now: noon)
        // When memory hears that the tables forgot the id as of that view
        try await store.engine.perform { $0.forget(["job-1"], applied: applied) }
        // Then memory still knows the new charge: sent again, it is answered again
        #expect(try await store.reserve(ReserveQuota(userId: "lee", jobId: "job-1"), now: noon).replayed == true)
        #expect(try await store.status(userId: "lee", now: noon).daily.used == 1)
        // But told as of a view that saw the new charge, memory forgets it (the tables would
        // have held only a settled row to delete; here the test tells it so directly)
        let now = try await store.engine.perform { $0.lastSeq }
        try await store.engine.perform { $0.forget(["job-1"], applied: now) }
        #expect(try await store.knownJobIds() == 0)
    }

    @Test func aStatusBetweenBatchesIsAnsweredFromMemoryAsTheLedgersThreadWouldAnswerIt() async throws {
        let folder = try Self.folder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let store = try Self.open(folder)
        // (From yesterday's UTC midnight: memory holds the windows of UTC yesterday to tomorrow
        // whole, so it knows every counter of those days without a read.)
        let today = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 / 86_400).rounded(.down) * 86_400)
        let start = today.addingTimeInterval(-86_400)
        // Given users with charges over two days, one on a plan that has ended and one on a
        // plan in a zone where the day has already turned
        var users = try await Self.workload(store, seed: 7, start: start)
        let end = start.addingTimeInterval(600 * 150)
        _ = try await store.setPlan(SetPlan(userId: "ended", plan: "pro", endsAt: start.addingTimeInterval(3600)), now: start)
        _ = try await store.setPlan(SetPlan(userId: "zoned", plan: "pro", timeZone: "Pacific/Kiritimati"), now: start)
        _ = try await store.reserve(ReserveQuota(userId: "zoned", jobId: "zoned-job", cost: 2), now: end)
        users += ["ended", "zoned", "never-seen"]
        // When each asks for its status between batches
        let batches = store.engine.batches
        var fromMemory: [QuotaStatus] = []
        for user in users { fromMemory.append(try await store.status(userId: user, now: end)) }
        // Then no batch ran for them (memory answered on the caller's thread)
        #expect(store.engine.batches == batches)
        // And each answer is the one the ledger's thread gives
        for (user, status) in zip(users, fromMemory) {
            let threads = try await store.engine.perform { try $0.status(userId: user, now: end) }
            #expect(status == threads, "\(user)")
        }
        #expect(store.engine.batches > batches)
        // And a window memory does not hold (last year's) is read on the ledger's thread
        let lastYear = start.addingTimeInterval(-365 * 86_400)
        let before = store.engine.batches
        let first = users[0]
        let old = try await store.status(userId: first, now: lastYear)
        #expect(store.engine.batches == before + 1)
        #expect(old == (try await store.engine.perform { try $0.status(userId: first, now: lastYear) }))
        // And a malformed user id is refused the same way
        await #expect(throws: BusError.self) { try await store.status(userId: "", now: end) }
    }

    @Test func chargesWrittenBeforeTheyWereKeyedByJobIdSurviveTheMigration() async throws {
        let folder = try Self.folder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let now = Date()
        // Given a database of the previous shape holding a reserved charge
        do {
            let pool = try DurableDatabase.open(path: folder.appendingPathComponent("quota.sqlite").path)
            try QuotaDatabase.migrator.migrate(pool, upTo: "v5: the ledger's checkpoint")
            try await pool.write { db in
                try db.execute(sql: """
                    INSERT INTO charge (jobId, userId, cost, state, dayKey, monthKey, reservedAt) VALUES ('old-job', 'old-user', 3, 'reserved', ?, ?, ?)
                    """, arguments: ["2026-11-20", "2026-11", StoredDate.text(now.addingTimeInterval(-600))])
            }
        }
        // When the service opens it
        let store = try Self.open(folder)
        // Then the charge is there, found by the stale scan while reserved, and settles
        #expect(try await store.staleReservations(before: now, limit: 10).map(\.jobId) == ["old-job"])
        #expect(try await store.commit(jobId: "old-job", now: now).cost == 3)
        #expect(try await store.usage(userId: "old-user", now: now).charges.map(\.state) == [.committed])
        #expect(try await store.staleReservations(before: now, limit: 10).isEmpty)
        // And the table is keyed by the job id, the stale scan's index holding reserved charges only
        let shape = try await store.read { db in
            try String.fetchOne(db, sql: "SELECT sql FROM sqlite_master WHERE name = 'charge'") ?? ""
        }
        #expect(shape.contains("WITHOUT ROWID"))
        let plan = try await store.read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN SELECT jobId FROM charge WHERE state = 'reserved' AND reservedAt < ? ORDER BY reservedAt LIMIT 5",
                             arguments: [StoredDate.text(now)]).map { $0["detail"] as String }
        }
        #expect(plan.joined(separator: "; ").contains("charge_reserved"), "\(plan)")
    }
}

