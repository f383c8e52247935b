import Foundation
import GRDB
import Storage

/// The quota service's database: users' plans, usage counters per calendar window, and the ledger
/// of charges. Opened in WAL mode with `synchronous=FULL`, so a committed admission is on disk.
public struct QuotaDatabase: Sendable {
    /// The connection every write goes through.
    public let writer: any DatabaseWriter
    /// Checkpoints the file's WAL outside the writer's commits, for as long as the database is open.
    private let checkpointer: WALCheckpointer?

    /// Wraps `writer` and brings its schema up to date.
    public init(_ writer: any DatabaseWriter) throws {
        try self.init(writer, checkpointer: nil)
    }

    private init(_ writer: any DatabaseWriter, checkpointer: WALCheckpointer?) throws {
        self.writer = writer
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
    public static func open(path: String) throws -> QuotaDatabase {
        let (pool, checkpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path) { db in
            // Only takes effect on an empty file; an existing one keeps its page size.
            try db.execute(sql: "PRAGMA page_size = 1024")
            try db.execute(sql: "PRAGMA cache_size = -32768")
        }
        return try QuotaDatabase(pool, checkpointer: checkpointer)
    }

    /// An in-memory database, for tests.
    public static func inMemory() throws -> QuotaDatabase {
        try QuotaDatabase(DatabaseQueue())
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
