import Foundation
import GRDB
import Messages
import QuotaCore
import Storage

/// The quota service's store on SQLite: users' plans, usage counters per calendar window, and
/// the ledger of charges. Opened in WAL mode with `synchronous=FULL`, so a committed admission is
/// on disk. Every write is one `QuotaLedger` operation in a group-committed transaction
/// (`GroupCommitter`); reads run on a reader connection. Nothing outside this type sees GRDB.
public struct QuotaDatabase: QuotaStore {
    /// The connection every write goes through (the tests' white-box checks read it too).
    let writer: any DatabaseWriter
    /// What each operation means in rows.
    let ledger: QuotaLedger
    /// Puts writes arriving together into one transaction.
    let committer: GroupCommitter
    /// Checkpoints the file's WAL outside the writer's commits, for as long as the database is open.
    private let checkpointer: WALCheckpointer?

    private init(_ writer: any DatabaseWriter, ledger: QuotaLedger, checkpointer: WALCheckpointer?) throws {
        self.writer = writer
        self.ledger = ledger
        self.committer = GroupCommitter(writer: writer)
        self.checkpointer = checkpointer
        try Self.migrator.migrate(writer)
    }

    /// Opens (or creates) the database file at `path`. A new file gets 1 KiB pages: every
    /// reservation changes rows at random places in three B-trees (job id, user's charges,
    /// usage), and a commit writes each page it changed whole to the WAL, so smaller pages write
    /// a fraction of the bytes (measured: 6.4 KB of WAL a decision instead of 15.7 KB).
    /// Each connection caches up to 32 MiB of pages (SQLite's default is 2 MiB, which a few
    /// thousand users outgrow: every lookup then reads the file). Its WAL is checkpointed in the
    /// background (`WALCheckpointer`).
    public static func open(path: String, plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits()) throws -> QuotaDatabase {
        let (pool, checkpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path) { db in
            // Only takes effect on an empty file; an existing one keeps its page size.
            try db.execute(sql: "PRAGMA page_size = 1024")
            try db.execute(sql: "PRAGMA cache_size = -32768")
        }
        return try QuotaDatabase(pool, ledger: QuotaLedger(plans: plans, guests: guests), checkpointer: checkpointer)
    }

    /// An in-memory database, for tests.
    public static func inMemory(plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits()) throws -> QuotaDatabase {
        try QuotaDatabase(DatabaseQueue(), ledger: QuotaLedger(plans: plans, guests: guests), checkpointer: nil)
    }

    // MARK: QuotaStore

    public func reserve(_ request: ReserveQuota, now: Date) async throws -> QuotaDecision {
        try await committer.perform { [ledger] db in try ledger.reserve(db, request, now: now) }
    }

    public func commit(jobId: String, now: Date) async throws -> Charge {
        try await committer.perform { [ledger] db in try ledger.commit(db, jobId: jobId, now: now) }
    }

    public func release(jobId: String, now: Date) async throws -> Charge {
        try await committer.perform { [ledger] db in try ledger.release(db, jobId: jobId, now: now) }
    }

    public func status(userId: String, now: Date) async throws -> QuotaStatus {
        try await writer.read { [ledger] db in try ledger.status(db, user: userId, now: now) }
    }

    public func setPlan(_ request: SetPlan, now: Date) async throws -> QuotaStatus {
        try await committer.perform { [ledger] db in try ledger.setPlan(db, request, now: now) }
    }

    public func applySubscription(_ event: SubscriptionEvent, now: Date) async throws -> SubscriptionOutcome {
        try await committer.perform { [ledger] db in try ledger.applySubscription(db, event, now: now) }
    }

    public func admitGuest(_ request: AdmitGuest, now: Date) async throws -> GuestAdmission {
        try await committer.perform { [ledger] db in try ledger.admitGuest(db, request, now: now) }
    }

    public func attestGuest(_ request: AttestGuest, now: Date) async throws -> GuestAttestation {
        try await committer.perform { [ledger] db in try ledger.attestGuest(db, request, now: now) }
    }

    public func usage(userId: String, now: Date) async throws -> UserUsage {
        try await writer.read { [ledger] db in try ledger.usage(db, user: userId, now: now) }
    }

    public func staleReservations(before cutoff: Date, limit: Int) async throws -> [String] {
        try await writer.read { db in
            try String.fetchAll(
                db, sql: "SELECT jobId FROM charge WHERE state = 'reserved' AND reservedAt < ? ORDER BY reservedAt LIMIT ?",
                arguments: [cutoff, limit]
            )
        }
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
        return migrator
    }
}
