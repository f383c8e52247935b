import Foundation
import GRDB
import Storage
import Messages

/// The jobs service's database: jobs (which history's events are read from) and the outbox of
/// quota settlements and file deletions.
///
/// It is the tables' one owner: every write goes through its group committer (`write`), the
/// store's and the outboxes' alike, and its writer is seen by no one else.
public struct JobsDatabase: Sendable {
    private let writer: any DatabaseWriter
    /// Creations, state changes and outbox acknowledgements arriving together share one
    /// transaction and one fsync (group commit); each caller hears back once its change is durable.
    private let writes: GroupCommitter
    /// Checkpoints the WAL of a database file outside the group committer's commits; stops when
    /// the last copy of this database is released.
    let checkpointer: WALCheckpointer?
    /// Every read, on threads of the database's own (`DatabaseReads`); ended at `close()`.
    private let reads: DatabaseReads

    public init(_ writer: any DatabaseWriter, checkpointer: WALCheckpointer? = nil) throws {
        self.writer = writer
        self.writes = GroupCommitter(writer: writer)
        reads = DatabaseReads(writer, name: "jobs-read")
        self.checkpointer = checkpointer
        try Self.migrator.migrate(writer)
        try DurableDatabase.keepWriterJournalsInMemory(writer)
    }

    /// Runs `body` in the group committer's next transaction; returns once it is durable.
    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writes.perform(body)
    }

    /// Runs `body` on a read-only connection (a snapshot, beside the writer).
    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await reads.read(body)
    }

    /// The group committer's counts: transactions and the changes they carried.
    public var writeStatistics: GroupCommitter.Statistics { writes.statistics }

    /// Refuses new writes, and returns once every write accepted is durable and answered (and
    /// the reads queued have run): the service's main calls it as it stops (`ClosedAtShutdown`).
    public func close() async {
        await writes.close()
        await reads.close()
        await checkpointer?.close()
    }

    /// Opens (or creates) the file at `path`, WAL with `synchronous=FULL`, checkpointed in the
    /// background: SQLite's automatic checkpoint would run inside the group committer's commits
    /// (2.6% of that thread's time in the noop benchmark's profile).
    public static func open(path: String) throws -> JobsDatabase {
        let (pool, checkpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path)
        return try JobsDatabase(pool, checkpointer: checkpointer)
    }

    public static func inMemory() throws -> JobsDatabase { try JobsDatabase(DatabaseQueue()) }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: jobs and outbox") { db in
            try db.create(table: "job") { table in
                table.primaryKey("id", .text)
                table.column("userId", .text).notNull()
                table.column("isPro", .boolean).notNull()
                table.column("imageKey", .text).notNull()
                table.column("effectId", .text).notNull()
                table.column("parameters", .text).notNull()
                table.column("prompt", .text)
                table.column("status", .text).notNull()
                table.column("progress", .double).notNull()
                table.column("attempts", .integer).notNull()
                table.column("maxAttempts", .integer).notNull()
                table.column("lastError", .text)
                table.column("resultKey", .text)
                table.column("thumbnailKey", .text)
                table.column("createdAt", .datetime).notNull()
                table.column("updatedAt", .datetime).notNull()
                table.column("startedAt", .datetime)
                table.column("finishedAt", .datetime)
                table.column("version", .integer).notNull()
                table.column("cancelRequested", .boolean).notNull().defaults(to: false)
            }
            try db.create(index: "job_by_status", on: "job", columns: ["status", "createdAt"])
            try db.create(index: "job_by_user", on: "job", columns: ["userId", "createdAt"])
            try db.create(table: "outbox") { table in
                table.autoIncrementedPrimaryKey("id")
                table.column("topic", .text).notNull()
                table.column("kind", .text).notNull()
                table.column("jobId", .text).notNull()
                table.column("version", .integer).notNull()
                table.column("payload", .blob)
                table.column("createdAt", .datetime).notNull()
                table.column("attempts", .integer).notNull().defaults(to: 0)
                table.column("nextAttemptAt", .datetime).notNull()
            }
            try db.create(index: "outbox_due", on: "outbox", columns: ["topic", "nextAttemptAt"])
        }
        migrator.registerMigration("v2: jobs by original image") { db in
            try db.create(index: "job_by_image", on: "job", columns: ["userId", "imageKey"])
        }
        migrator.registerMigration("v3: abandoned job ids") { db in
            // Ids quota gave the reservation of back because no such job existed: never created.
            try db.create(table: "abandoned") { table in
                table.primaryKey("jobId", .text)
                table.column("at", .datetime).notNull()
            }
        }
        migrator.registerMigration("v4: jobs by image key") { db in
            // The unused-upload sweep asks, for each day-old upload, whether any job uses it.
            try db.create(index: "job_by_image_key", on: "job", columns: ["imageKey"])
        }
        migrator.registerMigration("v5: prices and provider requests") { db in
            // The credits a job was charged (jobs from before prices cost one), and the request
            // of a generation submitted to a provider's queue (JSON `ProviderRequest`).
            try db.alter(table: "job") { table in
                table.add(column: "credits", .integer).notNull().defaults(to: 1)
                table.add(column: "submission", .text)
            }
        }
        migrator.registerMigration("v6: the trace a job was created in") { db in
            try db.alter(table: "job") { table in table.add(column: "traceParent", .text) }
        }
        migrator.registerMigration("v7: history's events read from the job rows") { db in
            // History hears a job's current version from the row itself (`JobsHistoryFeed`): a
            // change marks the row due (`historyDueAt`, nil once history has that version) instead
            // of writing an event of its own to the outbox.
            try db.alter(table: "job") { table in
                table.add(column: "historyDueAt", .datetime)
                table.add(column: "historyAttempts", .integer).notNull().defaults(to: 0)
            }
            try db.execute(sql: "CREATE INDEX job_history_due ON job (historyDueAt) WHERE historyDueAt IS NOT NULL")
            // Events still waiting in the outbox: their jobs' current versions are due instead.
            try db.execute(sql: "UPDATE job SET historyDueAt = updatedAt WHERE id IN (SELECT jobId FROM outbox WHERE topic = 'history')")
            try db.execute(sql: "DELETE FROM outbox WHERE topic = 'history'")
        }
        migrator.registerMigration("v8: the version of the image a job was created from") { db in
            // An object store's ETag of the input the gateway checked (`CreateJob.imageETag`).
            try db.alter(table: "job") { table in table.add(column: "imageETag", .text) }
        }
        migrator.registerMigration("v9: devices for push notifications") { db in
            // A user's devices (`PUT /api/v1/devices/{token}`): a job that ends writes one push
            // notification per device to the outbox, in the same transaction.
            try db.create(table: "device") { table in
                table.primaryKey("token", .text)
                table.column("userId", .text).notNull()
                table.column("platform", .text).notNull()
                table.column("environment", .text).notNull()
                table.column("registeredAt", .text).notNull()
            }
            try db.create(index: "device_by_user", on: "device", columns: ["userId", "registeredAt"])
        }
        migrator.registerMigration("v10: the operators' audit log") { db in
            // Every operator action (`/admin/v1`): who, what, on what, how many, when.
            try db.create(table: "audit") { table in
                table.autoIncrementedPrimaryKey("id")
                table.column("at", .datetime).notNull()
                table.column("actor", .text).notNull()
                table.column("action", .text).notNull()
                table.column("target", .text).notNull()
                table.column("filter", .text)
                table.column("count", .integer).notNull()
                table.column("detail", .text)
            }
        }
        migrator.registerMigration("v11: operators' dispatch controls") { db in
            // One row: `DispatchControls` as JSON (paused effects and providers, live limits,
            // drained workers).
            try db.execute(sql: "CREATE TABLE dispatch_controls (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)")
        }
        migrator.registerMigration("v12: each job's attempts") { db in
            // One row an attempt: the worker it went to, when it started and ended, how it ended.
            // Removed with its job.
            try db.execute(sql: """
                CREATE TABLE attempt (
                    jobId TEXT NOT NULL, attempt INTEGER NOT NULL, workerId TEXT, startedAt TEXT NOT NULL,
                    endedAt TEXT, outcome TEXT, error TEXT, PRIMARY KEY (jobId, attempt)) WITHOUT ROWID
                """)
        }
        migrator.registerMigration("v13: jobs by creation") { db in
            // The operators' job list, newest first, reads this backwards instead of sorting the
            // table (the console opens on it). A job's creation never changes: written once.
            try db.execute(sql: "CREATE INDEX job_created ON job (createdAt, id)")
        }
        migrator.registerMigration("v14: one index for jobs by image") { db in
            // `job_by_image` (userId, imageKey) and `job_by_image_key` (imageKey) served the two
            // questions asked of an image (does this user's other job use it; does any job use
            // it): (imageKey, userId) answers both, and a creation writes one index fewer.
            try db.execute(sql: "DROP INDEX job_by_image; DROP INDEX job_by_image_key; CREATE INDEX job_by_image_key ON job (imageKey, userId)")
        }
        return migrator
    }
}

extension JobRecord: FetchableRecord, PersistableRecord {
    public static var databaseTableName: String { "job" }

    /// `parameters` and `submission` are JSON in their columns, coded as `JobRows` codes them
    /// (Foundation's defaults, keys sorted), so rows written either way read back either way.
    public static func databaseJSONEncoder(for column: String) -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return encoder
    }

    public static func databaseJSONDecoder(for column: String) -> JSONDecoder { JSONDecoder() }

    public enum Columns {
        public static let id = Column("id")
        public static let userId = Column("userId")
        public static let status = Column("status")
        public static let createdAt = Column("createdAt")
        public static let imageKey = Column("imageKey")
    }
}

/// An event waiting for delivery: to quota (`commit`, `release`) or the blob janitor (`delete`).
/// (History's events come from the job rows: `JobsHistoryFeed`.)
public struct OutboxEntry: Codable, Sendable, FetchableRecord, MutablePersistableRecord {
    public static let databaseTableName = "outbox"
    public var id: Int64?
    public var topic: String
    public var kind: String
    public var jobId: String
    public var version: Int
    public var payload: Data?
    public var createdAt: Date
    public var attempts: Int
    public var nextAttemptAt: Date

    public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }

    public enum Columns {
        public static let topic = Column("topic")
        public static let jobId = Column("jobId")
        public static let nextAttemptAt = Column("nextAttemptAt")
    }

    /// Where an entry goes.
    public enum Topic {
        /// Push notifications of ended jobs, one per device (`PushNotice` as JSON).
        public static let push = "push"
        /// Quota settlements: `commit`, `release`.
        public static let quota = "quota"
        /// Job events for history: not an outbox topic since v7 (the rows are read instead), the
        /// name they are counted under (`JobCounts.outbox`).
        public static let history = "history"
        /// Files to delete from the blob store.
        public static let blobs = "blobs"
    }
}
