import Foundation
import HistoryCore
import Logging
import Messages
import PostgresNIO
import ServiceKit
import Storage

/// The history service's store on PostgreSQL (`HISTORY_DATABASE_URL`), for any number of history
/// replicas over one database. The same operations and answers as `HistoryDatabase`; what differs:
/// - **Search** is `ILIKE` over `pg_trgm` GIN indexes on the prompt and the effect title, so a
///   substring of any length matches, case-insensitively ("unset" finds "Sunset").
/// - **The changes feed** numbers each user's changes in that user's row (`history_user`): a
///   write takes the user's next number with the row's lock, held to its commit, so one user's
///   changes commit in the order of their numbers whichever replica writes them, and a reader (one
///   snapshot) never sees a later number without the earlier ones. Tokens are per user, and so is
///   the point below which deletions are no longer kept.
/// - **Events** are applied idempotently by (job id, version) under that same lock: two replicas
///   applying versions of one job at once apply them one after the other.
/// - **Every write locks the user first**, and a batch over several users locks them in id order,
///   so writers never wait on each other in a cycle.
/// - The token key is in `history_meta`, made once by the first replica that starts: every
///   replica opens every other's cursors and tokens.
public struct PostgresHistoryStore: HistoryStore {
    let database: PostgresPool
    let logger: Logger
    /// Mints and opens page cursors and changes tokens, with the key all replicas share.
    public let signer: TokenSigner

    /// The most items a user may have for a search to scan them all with a statement planned once
    /// (see `page`); a user with more is searched through the trigram indexes. (As
    /// `HistoryDatabase.scanUpTo`, lower: a scan here costs about 1.2 µs an item, and the
    /// planning it saves about 0.5 ms.)
    public let scanUpTo: Int

    /// The settings of this store's connections (`PostgresPool(settings:)`): sequential scans
    /// priced out. The pages, the counts and the scanned searches are statements prepared once per
    /// connection, and after five runs PostgreSQL keeps a generic plan made from the statistics of
    /// that moment. On a young database (tables of a few rows) that plan scans `history_item` whole
    /// and sorts it, and it is kept as the tables grow, until autovacuum's next ANALYZE: in psql, a
    /// page planned while the table held one item still scanned and sorted all of it after 20,000
    /// more. Every statement here reads a user's rows, or a time range, by an index, so none should
    /// scan a table whole; with the setting, the plan made while the table was small is the index
    /// range a page wants (a table with no usable index is still scanned). Jobs and quota fence
    /// their kept plans the same way, one function at a time (`SET enable_seqscan = off`).
    public static let sessionSettings = [("enable_seqscan", "off")]

    /// The store on a migrated `database` (made with `sessionSettings`), with the token key
    /// `tokenKey(_:logger:)` read.
    public init(database: PostgresPool, tokenKey: [UInt8], scanUpTo: Int = 1_000, logger: Logger) {
        self.scanUpTo = scanUpTo
        self.database = database
        self.logger = logger
        self.signer = TokenSigner(key: tokenKey)
    }

    /// The key of every replica's tokens, made by the first replica that asks: what a process
    /// reads once at start, after migrating (`PostgresPool.migrate(..., then:)`).
    @Sendable public static func tokenKey(_ db: PostgresConnection, logger: Logger) async throws -> [UInt8] {
        let fresh = Data(SystemRandomNumberGenerator.bytes(32))
        try await db.query("INSERT INTO history_meta (key, value) VALUES ('tokenKey', \(fresh)) ON CONFLICT (key) DO NOTHING", logger: logger)
        guard let key = try await db.first("SELECT value FROM history_meta WHERE key = 'tokenKey'", as: Data.self, logger: logger), key.count == 32 else {
            throw PostgresLocationError(description: "history_meta holds no usable token key")
        }
        return Array(key)
    }

    public static let migrations = [
        PostgresMigration("v1: items, trigram search, changes, shares, purges", [
            "CREATE EXTENSION IF NOT EXISTS pg_trgm",
            "CREATE TABLE history_meta (key text PRIMARY KEY, value bytea NOT NULL)",
            """
            CREATE TABLE history_user (
                user_id text COLLATE "C" PRIMARY KEY, change_sequence bigint NOT NULL DEFAULT 0, pruned_through bigint NOT NULL DEFAULT 0)
            """,
            """
            CREATE TABLE history_item (
                job_id text COLLATE "C" PRIMARY KEY, user_id text COLLATE "C" NOT NULL, effect_id text NOT NULL, effect_title text NOT NULL,
                prompt text, status text NOT NULL, progress double precision NOT NULL, created_at bigint NOT NULL,
                updated_at bigint NOT NULL, finished_at bigint, result_key text, thumbnail_key text, image_key text NOT NULL,
                parameters text NOT NULL, cost bigint NOT NULL, last_error text, version bigint NOT NULL, change_sequence bigint NOT NULL)
            """,
            "CREATE INDEX history_item_page ON history_item (user_id, created_at, job_id)",
            "CREATE INDEX history_item_status_page ON history_item (user_id, status, created_at, job_id)",
            "CREATE INDEX history_item_changes ON history_item (user_id, change_sequence)",
            "CREATE INDEX history_item_age ON history_item (created_at)",
            "CREATE INDEX history_item_prompt_search ON history_item USING gin (prompt gin_trgm_ops)",
            "CREATE INDEX history_item_title_search ON history_item USING gin (effect_title gin_trgm_ops)",
            """
            CREATE TABLE history_item_count (
                user_id text COLLATE "C" NOT NULL, status text NOT NULL, count bigint NOT NULL, PRIMARY KEY (user_id, status))
            """,
            """
            CREATE TABLE history_deletion (
                job_id text COLLATE "C" PRIMARY KEY, user_id text COLLATE "C" NOT NULL, created_at bigint NOT NULL,
                deleted_at bigint NOT NULL, change_sequence bigint NOT NULL)
            """,
            "CREATE INDEX history_deletion_changes ON history_deletion (user_id, change_sequence)",
            "CREATE INDEX history_deletion_age ON history_deletion (deleted_at)",
            """
            CREATE TABLE history_purge (
                job_id text COLLATE "C" PRIMARY KEY, user_id text NOT NULL, attempts bigint NOT NULL DEFAULT 0, next_attempt_at bigint NOT NULL)
            """,
            "CREATE INDEX history_purge_due ON history_purge (next_attempt_at)",
            """
            CREATE TABLE history_share (
                token text PRIMARY KEY, job_id text COLLATE "C" NOT NULL, user_id text NOT NULL, expires_at bigint NOT NULL)
            """,
            "CREATE INDEX history_share_by_job ON history_share (job_id)",
            "CREATE INDEX history_share_age ON history_share (expires_at)",
        ]),
        // A B-tree on created_at let the planner page a user's items by walking every user's in
        // time order and filtering (216 ms for an offset page at 5,000 of a user whose items are
        // the oldest, against 1.8 ms on history_item_page). A BRIN index still serves a scan by
        // age, and cannot give an order, so pages use the per-user index.
        PostgresMigration("v2: the age index as BRIN", [
            "DROP INDEX history_item_age",
            "CREATE INDEX history_item_age ON history_item USING brin (created_at)",
        ]),
    ]

    // MARK: Events

    /// Applies a delivery of job events in one transaction of at most 7 statements, whatever
    /// its size: BEGIN and the statement timeout; the change numbers of its users (one per event,
    /// their rows locked in user order, as every other write of a user locks it first); what is
    /// stored of its jobs (item and tombstone); then, the events decided in order in Swift, the
    /// tombstones they lift, every item written (one upsert of a JSON array of rows) and every
    /// count's change (one upsert).
    public func applyJobEvents(_ events: [JobEvent]) async throws -> Int {
        guard !events.isEmpty else { return 0 }
        let logger = logger
        return try await database.transaction { db in
            try await Self.apply(events, db, logger: logger)
        }
    }

    static func apply(_ events: [JobEvent], _ db: PostgresConnection, logger: Logger) async throws -> Int {
        // Change numbers: each user's counter moved by their events' number, in user order.
        var perUser: [String: Int] = [:]
        for event in events { perUser[event.job.userId, default: 0] += 1 }
        let users = Array(perUser.keys)
        var next: [String: Int64] = [:]
        for (user, last) in try await db.allRows(
            """
            INSERT INTO history_user (user_id, change_sequence)
            SELECT u, n FROM unnest(\(users)::text[], \(users.map { perUser[$0]! })::bigint[]) AS t(u, n) ORDER BY u
            ON CONFLICT (user_id) DO UPDATE SET change_sequence = history_user.change_sequence + excluded.change_sequence
            RETURNING user_id, change_sequence
            """,
            as: (String, Int64).self, logger: logger
        ) {
            next[user] = last - Int64(perUser[user]!) + 1
        }

        // What is stored of each job.
        struct Stored {
            var deletedCreatedAt: Int64?
            var version: Int?
            var status: String?
            var userId: String?
        }
        var stored: [String: Stored] = [:]
        for (id, deletedCreatedAt, version, status, userId) in try await db.allRows(
            """
            SELECT j, d.created_at, i.version, i.status, i.user_id FROM unnest(\(Array(Set(events.map(\.job.id))))::text[]) AS j
            LEFT JOIN history_deletion d ON d.job_id = j LEFT JOIN history_item i ON i.job_id = j
            """,
            as: (String, Int64?, Int?, String?, String?).self, logger: logger
        ) {
            stored[id] = Stored(deletedCreatedAt: deletedCreatedAt, version: version, status: status, userId: userId)
        }

        // The events in order, as one at a time would apply them.
        var lifted: Set<String> = []
        var written: [String: HistoryItemRow] = [:]
        var counts: [String: [String: Int]] = [:]
        var applied = 0
        for event in events {
            let job = event.job
            let sequence = next[job.userId]!
            next[job.userId] = sequence + 1
            var state = stored[job.id] ?? Stored()
            if let deletedCreatedAt = state.deletedCreatedAt {
                // A deleted job stays deleted; one created again under its id starts a new item.
                guard deletedCreatedAt != job.createdAt.milliseconds else { continue }
                lifted.insert(job.id)
                state.deletedCreatedAt = nil
            }
            if let version = state.version, version >= job.version {
                stored[job.id] = state
                continue
            }
            written[job.id] = try HistoryItemRow(event, changeSequence: sequence)
            // Counted under its user: an event naming another user for the job moves its count.
            if state.status != job.status.rawValue || state.userId != job.userId {
                if let status = state.status, let user = state.userId { counts[user, default: [:]][status, default: 0] -= 1 }
                counts[job.userId, default: [:]][job.status.rawValue, default: 0] += 1
            }
            state.version = job.version
            state.status = job.status.rawValue
            state.userId = job.userId
            stored[job.id] = state
            applied += 1
        }

        if !lifted.isEmpty {
            try await db.query("DELETE FROM history_deletion WHERE job_id = ANY(\(Array(lifted))::text[])", logger: logger)
        }
        if !written.isEmpty {
            let rows = String(decoding: try JSONEncoder().encode(written.values.sorted { $0.job_id < $1.job_id }), as: UTF8.self)
            try await db.query(
                """
                INSERT INTO history_item (\(unescaped: itemColumns))
                SELECT \(unescaped: itemColumns) FROM jsonb_populate_recordset(NULL::history_item, \(rows)::jsonb) ORDER BY job_id
                ON CONFLICT (job_id) DO UPDATE SET user_id = excluded.user_id, effect_id = excluded.effect_id, effect_title = excluded.effect_title,
                    prompt = excluded.prompt, status = excluded.status, progress = excluded.progress, created_at = excluded.created_at,
                    updated_at = excluded.updated_at, finished_at = excluded.finished_at, result_key = excluded.result_key,
                    thumbnail_key = excluded.thumbnail_key, image_key = excluded.image_key, parameters = excluded.parameters, cost = excluded.cost,
                    last_error = excluded.last_error, version = excluded.version, change_sequence = excluded.change_sequence
                """,
                logger: logger
            )
        }
        let changes = counts.flatMap { user, statuses in statuses.filter { $0.value != 0 }.map { (user, $0.key, $0.value) } }
        if !changes.isEmpty {
            try await db.query(
                """
                INSERT INTO history_item_count (user_id, status, count)
                SELECT u, s, c FROM unnest(\(changes.map(\.0))::text[], \(changes.map(\.1))::text[], \(changes.map(\.2))::bigint[]) AS t(u, s, c)
                ORDER BY u, s
                ON CONFLICT (user_id, status) DO UPDATE SET count = history_item_count.count + excluded.count
                """,
                logger: logger
            )
        }
        return applied
    }

    // MARK: Reads

    public func page(_ request: ListHistory) async throws -> HistoryPage {
        let (after, statuses, pattern, offset) = try pageParameters(request)
        let logger = logger
        // One statement (one snapshot, one round trip): the page's rows, each with the total. The
        // total comes from the counts kept per status, or, for a search, from counting what
        // matches. A page with no row has no total: from the top it is 0, and only past the last
        // item (an offset or a cursor beyond it) is it counted again.
        var (items, count): ([HistoryItem], Int)
        if let pattern {
            // A search reads the user's matching items once: each row carries the count of all of
            // them (a window over the matches, taken before the cursor and the limit), so the total
            // costs no second scan. A user with at most `scanUpTo` items (most) has them
            // all scanned by a prepared statement (`ScanSearch`): parsing the search and planning
            // it with its pattern was about 40% of PostgreSQL's time per search (perf: the parse,
            // and the planner's estimate of `ILIKE` over each column's histogram), more than the
            // scan of a few hundred items. A user with more (known when the scan finds no row) is
            // searched by a statement planned for its pattern, which reads the trigram indexes
            // when the pattern is rare (4 ms for one item of 100,000, where the scan took 100 ms).
            // Not prepared: a generic plan of `ILIKE $pattern` reads the trigram index of every
            // user's items (30 ms where the user's own are 1 ms).
            let bindings = searchBindings(request, statuses: statuses, pattern: pattern, after: after, offset: offset)
            (items, count) = try await database.connection { db in
                // No row: no match, or a user with more items than the scan takes.
                let (found, total) = try await Self.readPage(db.execute(ScanSearch(bindings: bindings), logger: logger))
                guard found.isEmpty else { return (found, total) }
                var size: Int64 = 0
                for try await items in try await db.execute(ItemCount(userId: request.userId), logger: logger) { size = items }
                guard size > scanUpTo else { return (found, total) }
                return try await Self.readPage(db.query(
                    """
                    SELECT * FROM (
                        SELECT count(*) OVER (), \(unescaped: Self.itemColumns) FROM history_item
                        WHERE user_id = \(request.userId)
                        AND (cardinality(\(statuses)::text[]) = 0 OR status = ANY(\(statuses)))
                        AND (prompt ILIKE \(pattern) OR effect_title ILIKE \(pattern))
                    ) AS matches
                    WHERE (\(after?.createdAt)::bigint IS NULL OR (created_at, job_id) < (\(after?.createdAt), \(after?.jobId)::text))
                    ORDER BY created_at DESC, job_id DESC LIMIT \(request.limit + 1) OFFSET \(offset)
                    """,
                    logger: logger
                ))
            }
        } else {
            // Any other page is a prepared statement of its shape (`PageShape`), planned once per
            // connection.
            let shape = PageShape(statuses: !statuses.isEmpty, cursor: after != nil)
            let bindings = Self.pageBindings(request, statuses: statuses, after: after, offset: offset)
            (items, count) = try await database.connection { [bindings] db in
                func read<Shape: PageShape.Named>(_: Shape.Type) async throws -> ([HistoryItem], Int) {
                    try await Self.readPage(db.execute(PreparedPage<Shape>(bindings: bindings), logger: logger))
                }
                switch (shape.statuses, shape.cursor) {
                case (false, false): return try await read(PageShape.Top.self)
                case (true, false): return try await read(PageShape.TopByStatus.self)
                case (false, true): return try await read(PageShape.After.self)
                case (true, true): return try await read(PageShape.AfterByStatus.self)
                }
            }
        }
        if items.isEmpty, offset > 0 || after != nil { count = try await self.count(request, statuses: statuses, pattern: pattern) }
        return HistoryReads.page(items, total: count, request: request, signer: signer)
    }

    /// What a page read takes from its request: the position it continues after (its cursor,
    /// checked), the statuses, the search as an `ILIKE` pattern, and the offset.
    func pageParameters(_ request: ListHistory) throws -> (after: PageCursor?, statuses: [String], pattern: String?, offset: Int) {
        let after = try HistoryReads.cursor(of: request, signer: signer)
        return (after, HistoryReads.statuses(of: request), HistoryReads.query(of: request).map(Self.containing),
                HistoryReads.offset(of: request, after: after))
    }

    /// The parameters of `ScanSearch` and `RenderedScanSearch`.
    func searchBindings(_ request: ListHistory, statuses: [String], pattern: String, after: PageCursor?, offset: Int) -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 8)
        bindings.append(request.userId)
        bindings.append(statuses)
        bindings.append(pattern)
        if let after {
            bindings.append(after.createdAt)
            bindings.append(after.jobId)
        } else {
            bindings.appendNull()
            bindings.appendNull()
        }
        bindings.append(Int64(request.limit + 1))
        bindings.append(Int64(offset))
        bindings.append(Int64(scanUpTo))
        return bindings
    }

    /// The parameters of a page's statement of its shape (`PageShape`).
    static func pageBindings(_ request: ListHistory, statuses: [String], after: PageCursor?, offset: Int) -> PostgresBindings {
        var bindings = PostgresBindings()
        bindings.append(request.userId)
        bindings.append(Int64(request.limit + 1))
        bindings.append(Int64(offset))
        if !statuses.isEmpty { bindings.append(statuses) }
        if let after {
            bindings.append(after.createdAt)
            bindings.append(after.jobId)
        }
        return bindings
    }

    /// The total of a page that has no row, counted again: from the counts kept per status, or
    /// for a search by counting what matches.
    func count(_ request: ListHistory, statuses: [String], pattern: String?) async throws -> Int {
        let logger = logger
        return try await database.connection { db in
            try await db.first(
                pattern.map { pattern in
                    """
                    SELECT count(*) FROM history_item WHERE user_id = \(request.userId)
                    AND (cardinality(\(statuses)::text[]) = 0 OR status = ANY(\(statuses)))
                    AND (prompt ILIKE \(pattern) OR effect_title ILIKE \(pattern))
                    """
                } ?? """
                    SELECT coalesce(sum(count), 0)::bigint FROM history_item_count WHERE user_id = \(request.userId)
                    AND (cardinality(\(statuses)::text[]) = 0 OR status = ANY(\(statuses)))
                    """,
                as: Int.self, logger: logger
            ) ?? 0
        }
    }

    /// A page's items and total from its rows (see `page`): each row is the total, then an
    /// item's columns. No row: no item, and a total of 0 (the caller counts again where that is
    /// not so).
    static func readPage<Rows: AsyncSequence & Sendable>(_ rows: Rows) async throws -> ([HistoryItem], Int) where Rows.Element == PostgresRow {
        var items: [HistoryItem] = []
        var count = 0
        for try await row in rows {
            let (total, item) = try Self.numberedItem(from: row)
            count = Int(total)
            items.append(item)
        }
        return (items, count)
    }

    /// The shape of a page that is not a search: with a status filter or not, from the newest or
    /// after a cursor. Each is a statement of its own, prepared once per connection: one statement
    /// with `$x IS NULL OR ...` for the parts not given was planned again at every page (0.2 to
    /// 1 ms of PostgreSQL's time, more than running it), and its generic plan could not use the
    /// cursor as the index range. Parameters: the user, the limit, the offset, then the statuses
    /// (with a filter), then the cursor's time and job id (after one). The total is a scalar
    /// subquery (run once, before the rows), so the page is the statement's own ordered index
    /// range: no join, no sort (15 to 30 % more pages/s in pgbench than a join of the two).
    struct PageShape: Equatable {
        var statuses: Bool
        var cursor: Bool

        var sql: String {
            let (total, filter) = clauses()
            return """
                SELECT \(total), \(PostgresHistoryStore.itemColumns)
                FROM history_item WHERE user_id = $1\(filter)
                ORDER BY created_at DESC, job_id DESC LIMIT $2 OFFSET $3
                """
        }

        /// `RenderedPage`'s statement: the same page as one row, the total and the items'
        /// records (`PostgresPageRecord.aggregate`), so that a page is one row to receive however
        /// many items it has. The records are made after the limit and the offset (made in the
        /// index scan, they would be made for every row an offset skips: 5,050 for a page at
        /// 5,000). The page is the index's own range, with no sort of the table
        /// (`PostgresHistoryPlanTests`); the aggregate orders its few rows.
        var recordSQL: String {
            let (total, filter) = clauses()
            return """
                SELECT \(total), (
                    SELECT \(PostgresPageRecord.aggregate)
                    FROM (
                        SELECT \(PostgresPageRecord.columns) FROM history_item WHERE user_id = $1\(filter)
                        ORDER BY created_at DESC, job_id DESC LIMIT $2 OFFSET $3
                    ) AS page
                )
                """
        }

        /// The total's subquery, and the conditions on the user's items past `user_id = $1`.
        private func clauses() -> (total: String, filter: String) {
            var next = 4
            func parameter() -> String { defer { next += 1 }; return "$\(next)" }
            let status = statuses ? " AND status = ANY(\(parameter())::text[])" : ""
            let after = cursor ? " AND (created_at, job_id) < (\(parameter())::bigint, \(parameter())::text)" : ""
            return ("(SELECT coalesce(sum(count), 0)::bigint FROM history_item_count WHERE user_id = $1\(status))", status + after)
        }

        protocol Named: Sendable { static var shape: PageShape { get } }
        enum Top: Named { static let shape = PageShape(statuses: false, cursor: false) }
        enum TopByStatus: Named { static let shape = PageShape(statuses: true, cursor: false) }
        enum After: Named { static let shape = PageShape(statuses: false, cursor: true) }
        enum AfterByStatus: Named { static let shape = PageShape(statuses: true, cursor: true) }
    }

    /// A statement prepared once per connection, whose parameters are made by the caller and
    /// whose rows are read as they come.
    protocol BoundStatement: PostgresPreparedStatement where Row == PostgresRow {
        var bindings: PostgresBindings { get }
    }

    /// A page of one shape, as postgres-nio prepares it (by name, once per connection).
    struct PreparedPage<Shape: PageShape.Named>: BoundStatement {
        static var name: String { "history_page_\(Shape.self)" }
        static var sql: String { Shape.shape.sql }
        var bindings: PostgresBindings
    }

    /// How many items a user has (the counts kept per status), prepared once per connection.
    struct ItemCount: PostgresPreparedStatement {
        typealias Row = Int64
        static let name = "history_item_count_of_user"
        static let sql = "SELECT coalesce(sum(count), 0)::bigint FROM history_item_count WHERE user_id = $1"
        var userId: String

        func makeBindings() throws -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 1)
            bindings.append(userId)
            return bindings
        }
        func decodeRow(_ row: PostgresRow) throws -> Int64 { try row.decode(Int64.self) }
    }

    /// A search of a user with few items (see `page`): their items scanned, whatever the
    /// pattern. The columns are searched through `coalesce`, which no index covers, so that the
    /// plan is the scan of the user's own items, never a trigram index of everyone's, and
    /// PostgreSQL's planner has no pattern to estimate over each column's histogram. Parameters:
    /// the user, the statuses (none: any), the pattern, the cursor's created-at and job id (or
    /// nulls), the limit, the offset, and the most items scanned: a user with more gets no row
    /// (a filter evaluated once, before the scan, from the counts kept per status).
    struct ScanSearch: BoundStatement {
        static let name = "history_search_scan"
        static let sql = statement(selecting: "*", from: "count(*) OVER (), \(PostgresHistoryStore.itemColumns)")

        /// The statement: `columns` of the page's rows of the matches, each row of which is
        /// `matches` (where `total` is the count of all of them).
        static func statement(selecting columns: String, from matches: String) -> String {
            """
            SELECT \(columns) FROM (
                SELECT \(matches) FROM history_item
                WHERE user_id = $1
                AND (SELECT coalesce(sum(count), 0)::bigint FROM history_item_count WHERE user_id = $1) <= $8::bigint
                AND (cardinality($2::text[]) = 0 OR status = ANY($2::text[]))
                AND (coalesce(prompt, '') ILIKE $3::text OR coalesce(effect_title, '') ILIKE $3::text)
            ) AS matches
            WHERE ($4::bigint IS NULL OR (created_at, job_id) < ($4::bigint, $5::text))
            ORDER BY created_at DESC, job_id DESC LIMIT $6::bigint OFFSET $7::bigint
            """
        }
        var bindings: PostgresBindings
    }

    public func item(_ jobId: String, userId: String) async throws -> HistoryItem? {
        let logger = logger
        return try await database.connection { db in
            for try await row in try await db.query(
                "SELECT \(unescaped: Self.itemColumns) FROM history_item WHERE job_id = \(jobId) AND user_id = \(userId)", logger: logger
            ) {
                return try Self.item(from: row)
            }
            return nil
        }
    }

    public func changes(_ request: ChangesSince) async throws -> HistoryChanges {
        let since = try HistoryReads.since(request, signer: signer)
        let (checkExpiry, limit, logger) = (request.token != nil, request.limit, logger)
        let (upserts, deletions) = try await database.transaction(.snapshotRead) { db in
            if checkExpiry,
               let pruned = try await db.first("SELECT pruned_through FROM history_user WHERE user_id = \(request.userId)", as: Int64.self, logger: logger),
               since < pruned {
                throw HistoryReads.tokenExpired
            }
            var upserts: [(sequence: Int64, item: HistoryItem)] = []
            for try await row in try await db.query(
                """
                SELECT change_sequence, \(unescaped: Self.itemColumns) FROM history_item WHERE user_id = \(request.userId) AND change_sequence > \(since)
                ORDER BY change_sequence LIMIT \(limit + 1)
                """,
                logger: logger
            ) {
                upserts.append(try Self.numberedItem(from: row))
            }
            let deletions = try await db.allRows(
                """
                SELECT change_sequence, job_id FROM history_deletion WHERE user_id = \(request.userId) AND change_sequence > \(since)
                ORDER BY change_sequence LIMIT \(limit + 1)
                """,
                as: (Int64, String).self, logger: logger
            ).map { (sequence: $0.0, jobId: $0.1) }
            return (upserts, deletions)
        }
        return HistoryReads.changes(upserts: upserts, deletions: deletions, since: since, request: request, signer: signer)
    }

    public func sharedResult(token: String, now: Date) async throws -> SharedResult? {
        let logger = logger
        return try await database.connection { db in
            guard let (jobId, expiresAt, resultKey) = try await db.firstRow(
                """
                SELECT s.job_id, s.expires_at, i.result_key FROM history_share s JOIN history_item i ON i.job_id = s.job_id
                WHERE s.token = \(token) AND s.expires_at > \(now.milliseconds) AND i.status = 'completed'
                """,
                as: (String, Int64, String?).self, logger: logger
            ), let resultKey else { return nil }
            return SharedResult(jobId: jobId, resultKey: resultKey, expiresAt: Date(milliseconds: expiresAt))
        }
    }

    // MARK: Deletions

    public func deleteItem(_ jobId: String, userId: String, now: Date) async throws -> DeletedHistoryItem? {
        let logger = logger
        return try await database.transaction { db in
            try await Self.lockUser(db, userId, logger: logger)
            if try await Self.removeItem(db, jobId: jobId, userId: userId, now: now, logger: logger) { return DeletedHistoryItem(jobId: jobId) }
            // Deleted before by this user (a retry of a delete whose answer was lost): the same answer.
            let deletedBefore = try await db.first(
                "SELECT 1 FROM history_deletion WHERE job_id = \(jobId) AND user_id = \(userId)", as: Int.self, logger: logger
            )
            return deletedBefore == nil ? nil : DeletedHistoryItem(jobId: jobId)
        }
    }

    public func usersWithItems(before: Date, afterUser: String, limit: Int) async throws -> (users: [String], scannedThrough: String?) {
        let logger = logger
        return try await database.transaction(.snapshotRead) { db in
            let scanned = try await db.all(
                "SELECT user_id FROM history_user WHERE user_id > \(afterUser) ORDER BY user_id LIMIT \(limit)", as: String.self, logger: logger
            )
            var users: [String] = []
            for user in scanned where try await db.first(
                "SELECT 1 FROM history_item WHERE user_id = \(user) AND created_at < \(before.milliseconds) LIMIT 1", as: Int.self, logger: logger
            ) != nil {
                users.append(user)
            }
            return (users, scanned.last)
        }
    }

    public func deleteExpiredItems(userId: String, before cutoff: Date, limit: Int, now: Date) async throws -> Int {
        // The statuses retention may take are the rule's (`RetentionRule.sweepable`).
        let statuses = RetentionRule.sweepable.map(\.rawValue)
        let logger = logger
        return try await database.transaction { db in
            try await Self.lockUser(db, userId, logger: logger)
            let jobIds = try await db.all(
                """
                SELECT job_id FROM history_item WHERE user_id = \(userId) AND created_at < \(cutoff.milliseconds) AND status = ANY(\(statuses))
                ORDER BY created_at LIMIT \(limit)
                """,
                as: String.self, logger: logger
            )
            var removed = 0
            for jobId in jobIds where try await Self.removeItem(db, jobId: jobId, userId: userId, now: now, logger: logger) { removed += 1 }
            return removed
        }
    }

    public func pruneTombstones(before: Date, now: Date, limit: Int) async throws -> Int {
        let logger = logger
        return try await database.transaction { db in
            let gone = try await db.allRows(
                """
                DELETE FROM history_deletion WHERE job_id IN (
                    SELECT d.job_id FROM history_deletion d
                    WHERE d.deleted_at < \(before.milliseconds) AND NOT EXISTS (SELECT 1 FROM history_purge p WHERE p.job_id = d.job_id)
                    ORDER BY d.deleted_at LIMIT \(limit))
                RETURNING user_id, change_sequence
                """,
                as: (String, Int64).self, logger: logger
            )
            let highest = Dictionary(gone.map { ($0.0, $0.1) }, uniquingKeysWith: max)
            for (user, sequence) in highest.sorted(by: { $0.key < $1.key }) {
                try await db.query(
                    "UPDATE history_user SET pruned_through = greatest(pruned_through, \(sequence)) WHERE user_id = \(user)", logger: logger
                )
            }
            try await db.query("DELETE FROM history_share WHERE expires_at <= \(now.milliseconds)", logger: logger)
            return gone.count
        }
    }

    // MARK: Shares

    public func shareItem(_ jobId: String, userId: String, token: String, expiresAt: Date) async throws -> ShareGrant? {
        let logger = logger
        return try await database.transaction { db in
            guard let status = try await db.first(
                "SELECT status FROM history_item WHERE job_id = \(jobId) AND user_id = \(userId)", as: String.self, logger: logger
            ) else { return nil }
            guard status == JobStatus.completed.rawValue else {
                throw BusError(History.ErrorCode.notShareable, "only a completed edit has a result to share; this one is \(status)")
            }
            try await db.query(
                "INSERT INTO history_share (token, job_id, user_id, expires_at) VALUES (\(token), \(jobId), \(userId), \(expiresAt.milliseconds))",
                logger: logger
            )
            // At most `HistoryDatabase.maxLinksPerItem` live links an item: a new one past that revokes the oldest.
            try await db.query(
                """
                DELETE FROM history_share WHERE job_id = \(jobId) AND token NOT IN
                    (SELECT token FROM history_share WHERE job_id = \(jobId) ORDER BY expires_at DESC LIMIT \(HistoryDatabase.maxLinksPerItem))
                """,
                logger: logger
            )
            return ShareGrant(token: token, expiresAt: expiresAt)
        }
    }

    public func revokeShares(_ jobId: String, userId: String) async throws -> Bool {
        let logger = logger
        return try await database.transaction { db in
            guard try await db.first("SELECT 1 FROM history_item WHERE job_id = \(jobId) AND user_id = \(userId)", as: Int.self, logger: logger) != nil else {
                return false
            }
            try await db.query("DELETE FROM history_share WHERE job_id = \(jobId)", logger: logger)
            return true
        }
    }

    // MARK: Purges

    public func pendingPurgeCount() async throws -> Int {
        let logger = logger
        return try await database.connection { db in
            try await db.first("SELECT count(*) FROM history_purge", as: Int.self, logger: logger) ?? 0
        }
    }

    public func duePurges(now: Date, limit: Int) async throws -> [OutboxItem<PendingPurge>] {
        let logger = logger
        return try await database.connection { db in
            try await db.allRows(
                "SELECT job_id, user_id, attempts FROM history_purge WHERE next_attempt_at <= \(now.milliseconds) ORDER BY next_attempt_at LIMIT \(limit)",
                as: (String, String, Int).self, logger: logger
            ).map { OutboxItem(id: $0.0, kind: PendingPurge(jobId: $0.0, userId: $0.1), jobId: $0.0, attempts: $0.2) }
        }
    }

    public func purgesAcknowledged(_ jobIds: [String]) async throws {
        let logger = logger
        try await database.connection { db in
            _ = try await db.query("DELETE FROM history_purge WHERE job_id = ANY(\(jobIds))", logger: logger)
        }
    }

    public func purgesFailed(_ entries: [OutboxRetry]) async throws {
        guard !entries.isEmpty else { return }
        let jobIds = entries.map(\.id), attempts = entries.map(\.attempts), times = entries.map { Int64($0.at.milliseconds) }
        let logger = logger
        try await database.connection { db in
            _ = try await db.query(
                """
                UPDATE history_purge p SET attempts = a.attempts, next_attempt_at = a.at
                FROM unnest(\(jobIds)::text[], \(attempts)::bigint[], \(times)::bigint[]) AS a(id, attempts, at) WHERE p.job_id = a.id
                """,
                logger: logger
            )
        }
    }

    // MARK: Shared by the writes

    /// Holds every other write of the user until this transaction ends (a user with items has
    /// a row; one without has nothing to change).
    static func lockUser(_ db: PostgresConnection, _ userId: String, logger: Logger) async throws {
        try await db.query("SELECT 1 FROM history_user WHERE user_id = \(userId) FOR UPDATE", logger: logger)
    }

    /// The user's next change number; the row lock it takes holds every other write of this
    /// user until this transaction ends.
    static func nextSequence(_ db: PostgresConnection, userId: String, logger: Logger) async throws -> Int64 {
        try await db.first(
            """
            INSERT INTO history_user (user_id, change_sequence) VALUES (\(userId), 1)
            ON CONFLICT (user_id) DO UPDATE SET change_sequence = history_user.change_sequence + 1
            RETURNING change_sequence
            """,
            as: Int64.self, logger: logger
        ) ?? 0
    }

    static func adjustCount(_ db: PostgresConnection, userId: String, status: String, by delta: Int, logger: Logger) async throws {
        try await db.query(
            """
            INSERT INTO history_item_count (user_id, status, count) VALUES (\(userId), \(status), \(delta))
            ON CONFLICT (user_id, status) DO UPDATE SET count = history_item_count.count + excluded.count
            """,
            logger: logger
        )
    }

    /// Removes one of the user's items (the caller holds the user's lock) from every read, leaves
    /// a tombstone for the changes feed and queues the purge of its job for jobs. False when it
    /// was gone already.
    static func removeItem(_ db: PostgresConnection, jobId: String, userId: String, now: Date, logger: Logger) async throws -> Bool {
        guard let (status, createdAt) = try await db.firstRow(
            "DELETE FROM history_item WHERE job_id = \(jobId) AND user_id = \(userId) RETURNING status, created_at",
            as: (String, Int64).self, logger: logger
        ) else { return false }
        try await adjustCount(db, userId: userId, status: status, by: -1, logger: logger)
        try await db.query("DELETE FROM history_share WHERE job_id = \(jobId)", logger: logger)
        let sequence = try await nextSequence(db, userId: userId, logger: logger)
        try await db.query(
            """
            INSERT INTO history_deletion (job_id, user_id, created_at, deleted_at, change_sequence)
            VALUES (\(jobId), \(userId), \(createdAt), \(now.milliseconds), \(sequence))
            ON CONFLICT (job_id) DO UPDATE SET user_id = excluded.user_id, created_at = excluded.created_at,
                deleted_at = excluded.deleted_at, change_sequence = excluded.change_sequence
            """,
            logger: logger
        )
        try await db.query(
            "INSERT INTO history_purge (job_id, user_id, next_attempt_at) VALUES (\(jobId), \(userId), \(now.milliseconds)) ON CONFLICT DO NOTHING",
            logger: logger
        )
        return true
    }

    /// An `ILIKE` pattern matching any text that contains `query` (its `%`, `_` and `\` taken
    /// literally).
    static func containing(_ query: String) -> String {
        var escaped = ""
        for character in query {
            if character == "%" || character == "_" || character == "\\" { escaped.append("\\") }
            escaped.append(character)
        }
        return "%" + escaped + "%"
    }

    // MARK: Rows

    /// The columns `item(from:)` reads, in its order.
    static let itemColumns = """
        job_id, user_id, effect_id, effect_title, prompt, status, progress, created_at, updated_at, finished_at, result_key,
        thumbnail_key, image_key, parameters, cost, last_error, version, change_sequence
        """

    /// The item of a row of `itemColumns` (its `change_sequence` left unread).
    static func item(from row: PostgresRow) throws -> HistoryItem {
        var cells = PostgresCells(row)
        return try item(&cells)
    }

    /// The number (a page's total, an item's change sequence) and the item of a row of a
    /// `bigint` and then `itemColumns`.
    static func numberedItem(from row: PostgresRow) throws -> (Int64, HistoryItem) {
        var cells = PostgresCells(row)
        let number = try cells.int64()
        return (number, try item(&cells))
    }

    /// The item of the next cells, `itemColumns` but the last (`change_sequence`), read one by
    /// one as their types (`PostgresCells`: postgres-nio's decoding of the whole row as one
    /// tuple took 2.2 times as long: 270 µs of CPU a first page of 50 items, against 123).
    static func item(_ cells: inout PostgresCells) throws -> HistoryItem {
        HistoryItem(
            jobId: try cells.string(), userId: try cells.string(), effectId: try cells.string(), effectTitle: try cells.string(),
            prompt: try cells.optionalString(), status: JobStatus(rawValue: try cells.string()) ?? .failed, progress: try cells.double(),
            createdAt: Date(milliseconds: try cells.int64()), updatedAt: Date(milliseconds: try cells.int64()),
            finishedAt: try cells.optionalInt64().map(Date.init(milliseconds:)), resultKey: try cells.optionalString(),
            thumbnailKey: try cells.optionalString(), originalImageKey: try cells.string(),
            parameters: HistoryReads.parameters(try cells.optionalString()), cost: try cells.int(), lastError: try cells.optionalString(),
            version: try cells.int()
        )
    }
}

extension PostgresHistoryStore.BoundStatement {
    func makeBindings() throws -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
}

extension SystemRandomNumberGenerator {
    /// `count` bytes from the system's secure generator.
    static func bytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
    }
}

/// An item's row as `jsonb_populate_recordset` reads it: keys named as `history_item`'s columns,
/// an absent key NULL.
struct HistoryItemRow: Encodable {
    var job_id, user_id, effect_id, effect_title: String
    var prompt: String?
    var status: String
    var progress: Double
    var created_at, updated_at: Int64
    var finished_at: Int64?
    var result_key, thumbnail_key: String?
    var image_key, parameters: String
    var cost: Int
    var last_error: String?
    var version: Int
    var change_sequence: Int64

    init(_ event: JobEvent, changeSequence: Int64) throws {
        let job = event.job
        job_id = job.id
        user_id = job.userId
        effect_id = job.effectId
        effect_title = event.effectTitle
        prompt = job.prompt
        status = job.status.rawValue
        progress = job.progress
        created_at = job.createdAt.milliseconds
        updated_at = job.updatedAt.milliseconds
        finished_at = job.finishedAt?.milliseconds
        result_key = job.resultKey
        thumbnail_key = job.thumbnailKey
        image_key = job.imageKey
        parameters = HistoryReads.json(job.parameters)
        cost = HistoryReads.cost(of: job)
        last_error = job.lastError
        version = job.version
        change_sequence = changeSequence
    }
}
