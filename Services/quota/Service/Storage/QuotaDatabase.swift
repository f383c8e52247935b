import Foundation
import GRDB
import Logging
import Messages
import QuotaCore
import Storage

/// The quota service's store on SQLite, with the state in memory: the windows and charges of
/// active users are held by `QuotaMemory` and are the authority for admission; each decision
/// (reserve, commit, release) appends one record to an append-only log, written and fsynced in
/// batches before anyone is answered (`QuotaEngine`, `LedgerLog`); the tables (`usage`,
/// `charge`) are derived from the log in the background (`LedgerCheckpointer`), and a restart
/// applies the log's tail to them before serving. Plans, subscription events and guests are rare
/// writes and go to their tables directly (WAL, `synchronous=FULL`). Nothing outside this type
/// and the ones it uses sees GRDB.
///
/// The log is a folder beside the database file: `quota.sqlite` keeps its log in
/// `quota.sqlite-ledger/`.
public struct QuotaDatabase: QuotaStore {
    /// The connection every table write goes through: on the ledger's thread (`engine`), the
    /// derived tables' checkpoints (`LedgerCheckpointer`), or the deletions of charges past the
    /// idempotency window (`forget`). No one else sees it (tests read its settings).
    let writer: any DatabaseWriter
    /// The plans, windows and checks.
    let ledger: QuotaLedger
    /// Decides in memory, in batches, durable before it answers.
    let engine: QuotaEngine
    /// Checkpoints the file's WAL outside the writer's commits, until `close()`.
    private let walCheckpointer: WALCheckpointer?

    private init(_ writer: any DatabaseWriter, ledger: QuotaLedger, log: LedgerLog?, applied: UInt64,
                 walCheckpointer: WALCheckpointer?, logger: Logger) throws {
        self.writer = writer
        self.ledger = ledger
        let checkpointer = LedgerCheckpointer(writer: writer, log: log, applied: applied, logger: logger)
        var memory = QuotaMemory(ledger: ledger, reader: writer, lastSeq: applied)
        try memory.warm(now: Date())
        engine = QuotaEngine(memory: memory, log: log, checkpointer: checkpointer)
        self.walCheckpointer = walCheckpointer
    }

    /// Refuses new operations and returns once every one accepted is durable and answered, and the
    /// WAL's checkpoints have stopped: the service's main calls it as it stops (`ClosedAtShutdown`).
    /// (The ledger's own checkpointer ends by itself once the tables hold the log; what it has
    /// not written yet is in the log, which the next start reads.)
    public func close() async {
        await engine.close()
        await walCheckpointer?.close()
    }

    /// Opens (or creates) the database file at `path` and its ledger folder, applying whatever
    /// the log holds beyond the tables first. A new file gets 1 KiB pages, and each connection
    /// caches up to 32 MiB of pages; its WAL is checkpointed in the background (`WALCheckpointer`).
    public static func open(
        path: String, plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits(), logger: Logger = Logger(label: "quota")
    ) throws -> QuotaDatabase {
        let (pool, walCheckpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path) { db in
            // Only takes effect on an empty file; an existing one keeps its page size.
            try db.execute(sql: "PRAGMA page_size = 1024")
            try db.execute(sql: "PRAGMA cache_size = -32768")
        }
        try migrator.migrate(pool)
        try DurableDatabase.keepWriterJournalsInMemory(pool)
        let directory = path + "-ledger"
        let applied = try replay(directory: directory, into: pool, logger: logger)
        let log = try LedgerLog(directory: directory, nextSeq: applied + 1)
        return try QuotaDatabase(pool, ledger: QuotaLedger(plans: plans, guests: guests), log: log, applied: applied,
                             walCheckpointer: walCheckpointer, logger: logger)
    }

    /// An in-memory database with no log on disk, for tests.
    public static func inMemory(plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits()) throws -> QuotaDatabase {
        let queue = try DatabaseQueue()
        try migrator.migrate(queue)
        return try QuotaDatabase(queue, ledger: QuotaLedger(plans: plans, guests: guests), log: nil, applied: 0,
                             walCheckpointer: nil, logger: Logger(label: "quota"))
    }

    /// Applies the changes of the log in `directory` that the tables do not hold yet, then
    /// deletes its segments; the last sequence number the tables then hold.
    static func replay(directory: String, into writer: any DatabaseWriter, logger: Logger) throws -> UInt64 {
        var applied = try writer.read { db in
            UInt64(bitPattern: try Int64.fetchOne(db, sql: "SELECT appliedSeq FROM ledger_state WHERE id = 1") ?? 0)
        }
        let (changes, files, torn) = try LedgerLog.readAll(directory: directory)
        let tail = changes.filter { $0.seq > applied }
        var start = tail.startIndex
        while start < tail.endIndex {
            let chunk = Array(tail[start..<min(start + 50_000, tail.endIndex)])
            try writer.write { try LedgerCheckpointer.apply(chunk, $0) }
            start += chunk.count
        }
        if let last = tail.last { applied = last.seq }
        for file in files { try FileManager.default.removeItem(atPath: file) }
        if !files.isEmpty { try LedgerLog.syncDirectory(directory) }
        if !tail.isEmpty || torn {
            logger.info("quota ledger replayed", metadata: [
                "changes": "\(tail.count)", "applied": "\(applied)", "torn-tail": "\(torn)",
            ])
        }
        return applied
    }

    // MARK: QuotaStore

    public func reserve(_ request: ReserveQuota, now: Date) async throws -> QuotaDecision {
        let need = QuotaMemory.Need(userId: request.userId, now: now, network: ledger.sharedNetwork(of: request), jobId: request.jobId)
        return try await engine.perform(need) { try $0.reserve(request, now: now) }
    }

    public func commit(jobId: String, now: Date) async throws -> Charge {
        try await engine.perform(QuotaMemory.Need(jobId: jobId)) { try $0.commit(jobId: jobId, now: now) }
    }

    public func release(jobId: String, now: Date) async throws -> Charge {
        try await engine.perform(QuotaMemory.Need(jobId: jobId)) { try $0.release(jobId: jobId, now: now) }
    }

    public func status(userId: String, now: Date) async throws -> QuotaStatus {
        // Between batches, from memory on the caller's thread (no hop to the ledger's thread).
        if let status = try engine.readNow({ try $0.heldStatus(userId: userId, now: now) }) { return status }
        return try await engine.perform(QuotaMemory.Need(userId: userId, now: now)) { try $0.status(userId: userId, now: now) }
    }

    public func adjust(_ request: AdjustCredits, now: Date) async throws -> CreditsAdjusted {
        try await engine.perform(QuotaMemory.Need(userId: request.userId, now: now, jobId: request.chargeId)) { try $0.adjust(request, now: now) }
    }

    public func setPlan(_ request: SetPlan, now: Date) async throws -> QuotaStatus {
        try await engine.perform { [writer, ledger] memory in
            try writer.write { try ledger.setPlan($0, request, now: now) }
            try memory.reload(user: request.userId)
            return try memory.status(userId: request.userId, now: now)
        }
    }

    public func applySubscription(_ event: SubscriptionEvent, now: Date) async throws -> SubscriptionOutcome {
        try await engine.perform { [writer, ledger] memory in
            let result = try writer.write { try ledger.applySubscription($0, event, now: now) }
            try memory.reload(user: event.userId)
            return SubscriptionOutcome(result: result, status: try memory.status(userId: event.userId, now: now))
        }
    }

    public func admitGuest(_ request: AdmitGuest, now: Date) async throws -> GuestAdmission {
        // Guests are not in memory: their table alone answers, written on the ledger's thread
        // as every other write of the tables.
        try await engine.perform { [writer, ledger] _ in try writer.write { db in try ledger.admitGuest(db, request, now: now) } }
    }

    /// Runs `body` on a read-only connection: the tables as the last checkpoint left them (for
    /// tests' checks of what a restart starts from).
    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writer.read(body)
    }

    public func attestGuest(_ request: AttestGuest, now: Date) async throws -> GuestAttestation {
        try await engine.perform { [writer, ledger] memory in
            let attestation = try writer.write { try ledger.attestGuest($0, request, now: now) }
            try memory.reload(user: request.userId)
            return attestation
        }
    }

    /// The user's status from memory, and their latest charges from the tables once they hold
    /// every change made before the call.
    public func usage(userId: String, now: Date) async throws -> UserUsage {
        let (status, seq) = try await engine.perform(QuotaMemory.Need(userId: userId, now: now)) {
            (try $0.status(userId: userId, now: now), $0.lastSeq)
        }
        try await engine.checkpointer.flush(through: seq)
        let charges = try await writer.read { [ledger] db in try ledger.charges(db, user: userId) }
        return UserUsage(status: status, charges: charges)
    }

    /// Reserved charges in the tables made before `cutoff`, but those memory knows are settled.
    public func staleReservations(before cutoff: Date, limit: Int) async throws -> [StaleReservation] {
        let reserved = try await writer.read { db in
            try Row.fetchAll(
                db, sql: "SELECT jobId, reservedAt FROM charge WHERE state = 'reserved' AND reservedAt < ? ORDER BY reservedAt LIMIT ?",
                arguments: [cutoff, limit]
            ).map { StaleReservation(jobId: $0["jobId"], reservedAt: $0["reservedAt"]) }
        }
        guard !reserved.isEmpty else { return [] }
        return try await engine.perform { memory in reserved.filter { !memory.isSettled($0.jobId) } }
    }

    /// Deletes settled charges from the tables, then from memory: those memory changed since the
    /// transaction's view (`appliedSeq`) stay there, to be written back by the checkpointer.
    public func forget(settledBefore cutoff: Date, limit: Int) async throws -> Int {
        let (jobIds, applied) = try await writer.write { db -> ([String], UInt64) in
            let jobIds = try String.fetchAll(
                db, sql: "SELECT jobId FROM charge WHERE state != 'reserved' AND settledAt < ? ORDER BY settledAt LIMIT ?",
                arguments: [StoredDate.text(cutoff), limit]
            )
            let delete = try db.cachedStatement(sql: "DELETE FROM charge WHERE jobId = ?")
            for jobId in jobIds { try delete.execute(arguments: [jobId]) }
            let applied = UInt64(bitPattern: try Int64.fetchOne(db, sql: "SELECT appliedSeq FROM ledger_state WHERE id = 1") ?? 0)
            return (jobIds, applied)
        }
        guard !jobIds.isEmpty else { return 0 }
        try await engine.perform { memory in memory.forget(jobIds, applied: applied) }
        return jobIds.count
    }

    /// How many job ids memory knows without reading (nil: more than it keeps), for tests.
    func knownJobIds() async throws -> Int? {
        try await engine.perform { $0.knownJobIds }
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: users, usage, charges") { db in
            try db.create(table: "user") { table in
                table.primaryKey("id", .text)
                table.column("plan", .text).notNull()
                table.column("timeZone", .text)
                table.column("updatedAt", .datetime).notNull()
            }
            try db.create(table: "usage", options: .withoutRowID) { table in
                table.column("userId", .text).notNull()
                table.column("window", .text).notNull()
                table.column("windowKey", .text).notNull()
                table.column("used", .integer).notNull()
                table.primaryKey(["userId", "window", "windowKey"])
            }
            try db.create(table: "charge") { table in
                table.primaryKey("jobId", .text)
                table.column("userId", .text).notNull()
                table.column("cost", .integer).notNull()
                table.column("state", .text).notNull()
                table.column("dayKey", .text).notNull()
                table.column("monthKey", .text).notNull()
                table.column("reservedAt", .datetime).notNull()
                table.column("settledAt", .datetime)
            }
            try db.create(index: "charge_by_user", on: "charge", columns: ["userId", "reservedAt"])
            try db.create(index: "charge_by_state", on: "charge", columns: ["state", "reservedAt"])
        }
        migrator.registerMigration("v2: plans with an end, subscription events") { db in
            try db.alter(table: "user") { table in
                table.add(column: "planEndsAt", .datetime)
                table.add(column: "subscriptionEventAt", .datetime)
            }
            try db.create(table: "subscription_event") { table in
                table.primaryKey("id", .text)
                table.column("userId", .text).notNull()
                table.column("type", .text).notNull()
                table.column("occurredAt", .datetime).notNull()
                table.column("result", .text).notNull()
                table.column("receivedAt", .datetime).notNull()
            }
        }
        migrator.registerMigration("v3: guests by client network") { db in
            // Each guest id with the network it was first seen from, and when (new guests a
            // network makes an hour are limited); and the network a guest's charge also went to.
            try db.create(table: "guest", options: .withoutRowID) { table in
                table.primaryKey("userId", .text)
                table.column("network", .text).notNull()
                table.column("firstSeen", .double).notNull()
            }
            try db.create(index: "guest_by_network", on: "guest", columns: ["network", "firstSeen"])
            try db.alter(table: "charge") { table in
                table.add(column: "network", .text)
            }
        }
        migrator.registerMigration("v4: attested guests") { db in
            // The App Attest key a guest's device attested: one guest per key.
            try db.alter(table: "guest") { table in
                table.add(column: "attestedKey", .text)
            }
            try db.execute(sql: "CREATE UNIQUE INDEX guest_by_attested_key ON guest (attestedKey) WHERE attestedKey IS NOT NULL")
        }
        migrator.registerMigration("v5: the ledger's checkpoint") { db in
            // The last change of the ledger's log that `charge` and `usage` hold.
            try db.execute(sql: "CREATE TABLE ledger_state (id INTEGER PRIMARY KEY CHECK (id = 1), appliedSeq INTEGER NOT NULL)")
            try db.execute(sql: "INSERT INTO ledger_state (id, appliedSeq) VALUES (1, 0)")
        }
        migrator.registerMigration("v6: charges keyed by job id alone") { db in
            // The checkpointer inserts a row for every new charge: as a rowid table with a unique
            // job id that was four B-trees (the rows, the job ids, by user, by state); keyed by the
            // job id it is three, and the stale scan's index holds only reserved charges (it
            // shrinks as they settle instead of growing with every charge ever made).
            try db.execute(sql: """
                CREATE TABLE charge_by_job (
                    jobId TEXT NOT NULL PRIMARY KEY, userId TEXT NOT NULL, cost INTEGER NOT NULL, state TEXT NOT NULL,
                    dayKey TEXT NOT NULL, monthKey TEXT NOT NULL, reservedAt DATETIME NOT NULL, settledAt DATETIME, network TEXT
                ) WITHOUT ROWID
                """)
            try db.execute(sql: """
                INSERT INTO charge_by_job (jobId, userId, cost, state, dayKey, monthKey, reservedAt, settledAt, network)
                SELECT jobId, userId, cost, state, dayKey, monthKey, reservedAt, settledAt, network FROM charge
                """)
            try db.execute(sql: "DROP TABLE charge")
            try db.execute(sql: "ALTER TABLE charge_by_job RENAME TO charge")
            try db.execute(sql: "CREATE INDEX charge_by_user ON charge (userId, reservedAt)")
            try db.execute(sql: "CREATE INDEX charge_reserved ON charge (reservedAt) WHERE state = 'reserved'")
        }
        migrator.registerMigration("v7: settled charges by when they settled") { db in
            // Charges settled before the idempotency window are forgotten (`forget`).
            try db.execute(sql: "CREATE INDEX charge_settled ON charge (settledAt) WHERE state != 'reserved'")
        }
        return migrator
    }
}
