import Foundation
import GRDB
import HistoryCore
import Messages
import Storage

/// The history service's database: the read model of the user's past edits, its search index,
/// the tombstones and sequence numbers of the changes feed, share links, and the outbox of purges
/// that jobs has not acknowledged yet. Each write is one method named for its intent, one
/// transaction each.
public struct HistoryDatabase: Sendable {
    private let writer: any DatabaseWriter
    /// Checkpoints the WAL of a database file outside the writer's commits (those that apply
    /// jobs' events come continuously); stops at `close()`.
    private let checkpointer: WALCheckpointer?
    /// Every read, on threads of the database's own (`DatabaseReads`); ended at `close()`.
    private let reads: DatabaseReads
    /// Mints and opens page cursors and changes tokens; its key lives in the database.
    public let signer: TokenSigner
    /// A search of a user with at most this many items reads their items one by one; a longer
    /// history asks the trigram index (see `docs/history.md` for the figures behind it).
    public let scanUpTo: Int

    /// A database on `writer`, whose connections were prepared with `prepare(_:)`.
    public init(_ writer: any DatabaseWriter, scanUpTo: Int = 10_000, checkpointer: WALCheckpointer? = nil) throws {
        self.writer = writer
        self.checkpointer = checkpointer
        reads = DatabaseReads(writer, name: "history-read")
        self.scanUpTo = scanUpTo
        try Self.migrator.migrate(writer)
        try DurableDatabase.keepWriterJournalsInMemory(writer)
        let key = try writer.read { db in try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'tokenKey'") }
        signer = TokenSigner(key: Array(key ?? Data()))
    }

    /// Stops the reads' threads (once the reads queued have run) and the background checkpoints:
    /// the service's main calls it as it stops (`ClosedAtShutdown`). Writes go straight to the
    /// writer, which answers each once durable.
    public func close() async {
        await reads.close()
        await checkpointer?.close()
    }

    /// Opens (or creates) the file at `path`, WAL with `synchronous=FULL`, checkpointed in the
    /// background as jobs' and quota's are.
    public static func open(path: String) throws -> HistoryDatabase {
        let (pool, checkpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path, prepare: prepare)
        return try HistoryDatabase(pool, checkpointer: checkpointer)
    }

    /// A database in memory, for tests.
    public static func inMemory(scanUpTo: Int = 10_000) throws -> HistoryDatabase {
        var configuration = Configuration()
        configuration.prepareDatabase(prepare)
        return try HistoryDatabase(DatabaseQueue(configuration: configuration), scanUpTo: scanUpTo)
    }

    /// Adds `history_contains(text, foldedQuery)` to a connection: whether `text`, case-folded,
    /// contains the (already folded) query. The search of a short history.
    @Sendable static func prepare(_ db: Database) throws {
        db.add(function: DatabaseFunction("history_contains", argumentCount: 2, pure: true) { values in
            guard let text = String.fromDatabaseValue(values[0]), let query = String.fromDatabaseValue(values[1]) else { return false }
            return text.lowercased().contains(query)
        })
    }

    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writer.write(body)
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await reads.read(body)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: items, search, changes, shares, purges") { db in
            try db.execute(sql: """
                CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value) WITHOUT ROWID;
                INSERT INTO meta (key, value) VALUES ('changeSequence', 0), ('prunedThrough', 0), ('tokenKey', randomblob(32));

                CREATE TABLE item (
                    id INTEGER PRIMARY KEY,
                    jobId TEXT NOT NULL UNIQUE,
                    userId TEXT NOT NULL,
                    effectId TEXT NOT NULL,
                    effectTitle TEXT NOT NULL,
                    prompt TEXT,
                    status TEXT NOT NULL,
                    progress REAL NOT NULL,
                    createdAt INTEGER NOT NULL,
                    updatedAt INTEGER NOT NULL,
                    finishedAt INTEGER,
                    resultKey TEXT,
                    thumbnailKey TEXT,
                    imageKey TEXT NOT NULL,
                    parameters TEXT NOT NULL,
                    cost INTEGER NOT NULL,
                    lastError TEXT,
                    version INTEGER NOT NULL,
                    changeSequence INTEGER NOT NULL
                );
                CREATE INDEX item_page ON item (userId, createdAt, jobId);
                CREATE INDEX item_status_page ON item (userId, status, createdAt, jobId);
                CREATE INDEX item_changes ON item (userId, changeSequence);
                CREATE INDEX item_age ON item (createdAt);

                CREATE VIRTUAL TABLE item_search USING fts5 (
                    prompt, effectTitle, content = 'item', content_rowid = 'id', tokenize = 'trigram'
                );
                CREATE TRIGGER item_search_insert AFTER INSERT ON item BEGIN
                    INSERT INTO item_search (rowid, prompt, effectTitle) VALUES (new.id, new.prompt, new.effectTitle);
                END;
                CREATE TRIGGER item_search_delete AFTER DELETE ON item BEGIN
                    INSERT INTO item_search (item_search, rowid, prompt, effectTitle) VALUES ('delete', old.id, old.prompt, old.effectTitle);
                END;
                CREATE TRIGGER item_search_update AFTER UPDATE OF prompt, effectTitle ON item BEGIN
                    INSERT INTO item_search (item_search, rowid, prompt, effectTitle) VALUES ('delete', old.id, old.prompt, old.effectTitle);
                    INSERT INTO item_search (rowid, prompt, effectTitle) VALUES (new.id, new.prompt, new.effectTitle);
                END;

                CREATE TABLE item_count (
                    userId TEXT NOT NULL, status TEXT NOT NULL, count INTEGER NOT NULL,
                    PRIMARY KEY (userId, status)
                ) WITHOUT ROWID;

                CREATE TABLE deletion (
                    jobId TEXT PRIMARY KEY NOT NULL,
                    userId TEXT NOT NULL,
                    createdAt INTEGER NOT NULL,
                    deletedAt INTEGER NOT NULL,
                    changeSequence INTEGER NOT NULL
                ) WITHOUT ROWID;
                CREATE INDEX deletion_changes ON deletion (userId, changeSequence);
                CREATE INDEX deletion_age ON deletion (deletedAt);

                CREATE TABLE purge (
                    jobId TEXT PRIMARY KEY NOT NULL,
                    userId TEXT NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    nextAttemptAt INTEGER NOT NULL
                ) WITHOUT ROWID;
                CREATE INDEX purge_due ON purge (nextAttemptAt);

                CREATE TABLE share (
                    token TEXT PRIMARY KEY NOT NULL,
                    jobId TEXT NOT NULL,
                    userId TEXT NOT NULL,
                    expiresAt INTEGER NOT NULL
                ) WITHOUT ROWID;
                CREATE INDEX share_by_job ON share (jobId);
                CREATE INDEX share_age ON share (expiresAt);
                """)
        }
        // The item table clustered on (user, created, job): a page is one range read of the
        // table itself, where it was a range of `item_page` and then a lookup by rowid for each
        // item. `id` stays (unique, given out from `meta`'s `itemId`) as the search index's
        // rowid, so the index is kept as it is. Run in the migration's transaction: an existing
        // database is copied over whole, or not at all.
        migrator.registerMigration("v2: items clustered by user, creation and job") { db in
            try db.execute(sql: """
                CREATE TABLE item_clustered (
                    userId TEXT NOT NULL,
                    createdAt INTEGER NOT NULL,
                    jobId TEXT NOT NULL UNIQUE,
                    id INTEGER NOT NULL UNIQUE,
                    effectId TEXT NOT NULL,
                    effectTitle TEXT NOT NULL,
                    prompt TEXT,
                    status TEXT NOT NULL,
                    progress REAL NOT NULL,
                    updatedAt INTEGER NOT NULL,
                    finishedAt INTEGER,
                    resultKey TEXT,
                    thumbnailKey TEXT,
                    imageKey TEXT NOT NULL,
                    parameters TEXT NOT NULL,
                    cost INTEGER NOT NULL,
                    lastError TEXT,
                    version INTEGER NOT NULL,
                    changeSequence INTEGER NOT NULL,
                    PRIMARY KEY (userId, createdAt, jobId)
                ) WITHOUT ROWID;
                INSERT INTO item_clustered (userId, createdAt, jobId, id, effectId, effectTitle, prompt, status, progress, updatedAt, finishedAt,
                    resultKey, thumbnailKey, imageKey, parameters, cost, lastError, version, changeSequence)
                SELECT userId, createdAt, jobId, id, effectId, effectTitle, prompt, status, progress, updatedAt, finishedAt,
                    resultKey, thumbnailKey, imageKey, parameters, cost, lastError, version, changeSequence FROM item;
                INSERT INTO meta (key, value) SELECT 'itemId', COALESCE(MAX(id), 0) FROM item;
                DROP TRIGGER item_search_insert;
                DROP TRIGGER item_search_delete;
                DROP TRIGGER item_search_update;
                DROP TABLE item;
                ALTER TABLE item_clustered RENAME TO item;
                CREATE INDEX item_status_page ON item (userId, status, createdAt, jobId);
                CREATE INDEX item_changes ON item (userId, changeSequence);
                CREATE INDEX item_age ON item (createdAt);
                CREATE TRIGGER item_search_insert AFTER INSERT ON item BEGIN
                    INSERT INTO item_search (rowid, prompt, effectTitle) VALUES (new.id, new.prompt, new.effectTitle);
                END;
                CREATE TRIGGER item_search_delete AFTER DELETE ON item BEGIN
                    INSERT INTO item_search (item_search, rowid, prompt, effectTitle) VALUES ('delete', old.id, old.prompt, old.effectTitle);
                END;
                CREATE TRIGGER item_search_update AFTER UPDATE OF prompt, effectTitle ON item BEGIN
                    INSERT INTO item_search (item_search, rowid, prompt, effectTitle) VALUES ('delete', old.id, old.prompt, old.effectTitle);
                    INSERT INTO item_search (rowid, prompt, effectTitle) VALUES (new.id, new.prompt, new.effectTitle);
                END;
                """)
        }
        // The search index kept by the writes themselves (`SearchIndex`), not by triggers. A
        // trigger made each insert of an item a statement that writes two tables, so SQLite kept
        // a statement journal for it, which spilled to a temporary file past 64 KiB: in a batch
        // of 200 events that was 16 `pwrite`s per item, two thirds of history's CPU per job.
        // And the update trigger fired at every event (the update names every column), deleting
        // and adding the same words again. The index's content is unchanged.
        migrator.registerMigration("v3: search index kept without triggers") { db in
            try db.execute(sql: """
                DROP TRIGGER item_search_insert;
                DROP TRIGGER item_search_delete;
                DROP TRIGGER item_search_update;
                """)
        }
        return migrator
    }

    /// The trigram index of items' prompts and effect titles (`item_search`, whose content is
    /// the item table): each write that adds, changes or removes those of an item says so here,
    /// in its transaction.
    enum SearchIndex {
        static func add(_ db: Database, id: Int64, prompt: String?, effectTitle: String) throws {
            try db.cachedStatement(sql: "INSERT INTO item_search (rowid, prompt, effectTitle) VALUES (?, ?, ?)")
                .execute(arguments: [id, prompt, effectTitle])
        }

        /// Removes the entry of item `id`, before the item itself changes or goes: the index is
        /// told the text it holds straight from the item's row (SQLite's value as it is; read
        /// into Swift, text would end at an embedded NUL and no longer match).
        static func remove(_ db: Database, id: Int64) throws {
            try db.cachedStatement(sql: """
                INSERT INTO item_search (item_search, rowid, prompt, effectTitle) SELECT 'delete', id, prompt, effectTitle FROM item WHERE id = ?
                """).execute(arguments: [id])
        }
    }

    // MARK: Shared by the writes

    /// The next number of the changes feed.
    static func nextChangeSequence(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db.cachedStatement(sql: "UPDATE meta SET value = value + 1 WHERE key = 'changeSequence' RETURNING value")) ?? 0
    }

    static func adjustCount(_ db: Database, userId: String, status: String, by delta: Int) throws {
        try db.cachedStatement(sql: """
            INSERT INTO item_count (userId, status, count) VALUES (?, ?, ?)
            ON CONFLICT (userId, status) DO UPDATE SET count = count + excluded.count
            """
        ).execute(arguments: [userId, status, delta])
        if delta < 0 {
            try db.cachedStatement(sql: "DELETE FROM item_count WHERE userId = ? AND status = ? AND count <= 0").execute(arguments: [userId, status])
        }
    }

    /// Removes an item for good from every read (row, search entry, counts, share links), leaves
    /// a tombstone for the changes feed and queues the purge of its job for jobs.
    static func removeItem(_ db: Database, row: Row, now: Date) throws {
        let jobId: String = row["jobId"], userId: String = row["userId"], status: String = row["status"]
        let id: Int64 = row["id"]
        try SearchIndex.remove(db, id: id)
        try db.execute(sql: "DELETE FROM item WHERE id = ?", arguments: [id])
        try adjustCount(db, userId: userId, status: status, by: -1)
        try db.execute(sql: "DELETE FROM share WHERE jobId = ?", arguments: [jobId])
        try db.execute(
            sql: "INSERT OR REPLACE INTO deletion (jobId, userId, createdAt, deletedAt, changeSequence) VALUES (?, ?, ?, ?, ?)",
            arguments: [jobId, userId, row["createdAt"] as Int64, now.milliseconds, try nextChangeSequence(db)]
        )
        try db.execute(
            sql: "INSERT OR IGNORE INTO purge (jobId, userId, nextAttemptAt) VALUES (?, ?, ?)",
            arguments: [jobId, userId, now.milliseconds]
        )
    }
}
