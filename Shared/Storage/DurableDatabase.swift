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

    /// Opens the database at `path` as `open` does, with its WAL checkpointed by a
    /// `WALCheckpointer` rather than inside the writer's commits: for a database written
    /// continuously. The checkpointer runs until its `close()` (or its release).
    public static func openWithBackgroundCheckpoints(
        path: String, prepare: @escaping @Sendable (Database) throws -> Void = { _ in }
    ) throws -> (DatabasePool, WALCheckpointer) {
        let pool = try open(path: path) { db in
            try prepare(db)
            try db.execute(sql: "PRAGMA wal_autocheckpoint = \(WALCheckpointer.safetyPages)")
        }
        return (pool, try WALCheckpointer.start(path: path))
    }

    /// Run once the migrations are done: the writer keeps the journals of its statements and
    /// savepoints in memory (`temp_store = MEMORY`). SQLite spills such a journal to a file in
    /// the temporary folder once it passes 64 KiB, and the jobs store, which runs a batch's
    /// writes in a savepoint (so that a failing write can be undone alone), passed that in most
    /// batches: a run of 5,000 no-op jobs created 407 temporary files, and its `pwrite`s to them
    /// were near as many as to the WAL. Those journals hold the pages a batch changes, which the
    /// group committers bound. After the migrations, so that a migration's sort of a large table
    /// still goes to files; reads keep the default on their connections.
    public static func keepWriterJournalsInMemory(_ writer: any DatabaseWriter) throws {
        try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA temp_store = MEMORY") }
    }
}
