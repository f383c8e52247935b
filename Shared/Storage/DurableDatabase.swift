import GRDB

/// How every service opens its SQLite file: WAL (GRDB's `DatabasePool`), `synchronous=FULL` so a
/// committed transaction is on disk before anyone hears of it, and a busy timeout.
public enum DurableDatabase {
    /// Opens (or creates) the database file at `path`; `prepare` runs on every connection (to add
    /// SQL functions, say).
    public static func open(path: String, prepare: @escaping @Sendable (Database) throws -> Void = { _ in }) throws -> DatabasePool {
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
            try prepare(db)
        }
        configuration.busyMode = .timeout(5)
        return try DatabasePool(path: path, configuration: configuration)
    }
}
