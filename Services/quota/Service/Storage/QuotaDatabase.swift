import Foundation
import GRDB
import Storage

/// The quota service's database: users' plans, usage counters per calendar window, and the ledger
/// of charges. Opened in WAL mode with `synchronous=FULL`, so a committed admission is on disk.
public struct QuotaDatabase: Sendable {
    /// The connection every write goes through.
    public let writer: any DatabaseWriter

    /// Wraps `writer` and brings its schema up to date.
    public init(_ writer: any DatabaseWriter) throws {
        self.writer = writer
        try Self.migrator.migrate(writer)
    }

    /// Opens (or creates) the database file at `path`.
    public static func open(path: String) throws -> QuotaDatabase {
        try QuotaDatabase(DurableDatabase.open(path: path))
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
        return migrator
    }
}
