import Foundation
import GRDB
import HistoryCore
import Messages

extension HistoryDatabase {
    /// A page of the user's items, newest first (by creation time, then job id), searched results
    /// too. With a cursor the page starts after the cursor's item, so new items arriving at the
    /// top do not shift it; otherwise it starts at `offset`. `totalCount` counts the whole
    /// filtered set. Throws `history.invalid_cursor` for a cursor not issued for this user and query.
    public func page(_ request: ListHistory) async throws -> HistoryPage {
        let (items, total) = try await pageRows(request) { filter, db, limit, offset in try filter.items(db, limit: limit, offset: offset) }
        return HistoryReads.page(items, total: total, request: request, signer: signer)
    }

    /// A page's rows as `fetch` reads them (up to `limit + 1` from the filter at the offset, or
    /// after the cursor), and the count of the whole filtered set, in one snapshot.
    func pageRows<Rows: Sendable>(
        _ request: ListHistory, fetch: @escaping @Sendable (Filter, Database, _ limit: Int, _ offset: Int) throws -> Rows
    ) async throws -> (Rows, total: Int) {
        let after = try HistoryReads.cursor(of: request, signer: signer)
        let scanUpTo = scanUpTo
        return try await read { db in
            var filter = Filter(request)
            if filter.query != nil {
                let items = try Filter.storedCount(db, userId: request.userId, statuses: [])
                filter.scan = items <= scanUpTo
                try filter.chooseIndexOrder(db, userItems: items)
            }
            let total = try filter.count(db)
            if let after { filter.after(after) }
            return (try fetch(filter, db, request.limit + 1, HistoryReads.offset(of: request, after: after)), total)
        }
    }

    /// One of the user's items, nil for anyone else's or an unknown id.
    public func item(_ jobId: String, userId: String) async throws -> HistoryItem? {
        try await read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT \(Self.itemColumns) FROM item WHERE jobId = ? AND userId = ?"), arguments: [jobId, userId])
                .map(Self.item(from:))
        }
    }

    /// The user's changes after `token` (nil: from the beginning), oldest first: the current
    /// state of each item changed since, and the ids of items deleted since. A token older than
    /// the tombstones kept answers `history.token_expired`.
    public func changes(_ request: ChangesSince) async throws -> HistoryChanges {
        let since = try HistoryReads.since(request, signer: signer)
        let limit = request.limit
        let checkExpiry = request.token != nil
        let (upserts, deletions) = try await read { db in
            if checkExpiry, let pruned = try Int64.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'prunedThrough'"), since < pruned {
                throw HistoryReads.tokenExpired
            }
            let upserts = try Array(Row.fetchCursor(
                db, sql: "SELECT \(Self.itemColumns) FROM item WHERE userId = ? AND changeSequence > ? ORDER BY changeSequence LIMIT ?",
                arguments: [request.userId, since, limit + 1]
            ).map { (sequence: $0[Self.changeSequenceColumn] as Int64, item: Self.item(from: $0)) })
            let deletions = try Row.fetchAll(
                db, sql: "SELECT jobId, changeSequence FROM deletion WHERE userId = ? AND changeSequence > ? ORDER BY changeSequence LIMIT ?",
                arguments: [request.userId, since, limit + 1]
            ).map { (sequence: $0["changeSequence"] as Int64, jobId: $0["jobId"] as String) }
            return (upserts, deletions)
        }
        return HistoryReads.changes(upserts: upserts, deletions: deletions, since: since, request: request, signer: signer)
    }

    /// What a share link grants at `now`, nil once it is revoked, expired or its item deleted.
    public func sharedResult(token: String, now: Date) async throws -> SharedResult? {
        try await read { db in
            guard let row = try Row.fetchOne(
                db, sql: """
                    SELECT share.jobId, share.expiresAt, item.resultKey FROM share JOIN item ON item.jobId = share.jobId
                    WHERE share.token = ? AND share.expiresAt > ? AND item.status = 'completed'
                    """,
                arguments: [token, now.milliseconds]
            ), let resultKey: String = row["resultKey"] else { return nil }
            return SharedResult(jobId: row["jobId"], resultKey: resultKey, expiresAt: Date(milliseconds: row["expiresAt"]))
        }
    }

    // MARK: Rows

    /// The columns `item(from:)` reads, in its order: rows are read by position, since GRDB's
    /// lookup by name folds the case of every name on every read.
    static let itemColumns = """
        jobId, userId, effectId, effectTitle, prompt, status, progress, createdAt, updatedAt, finishedAt, resultKey,
        thumbnailKey, imageKey, parameters, cost, lastError, version, changeSequence
        """

    /// The position of `changeSequence` in `itemColumns`.
    static let changeSequenceColumn = 17

    static func item(from row: Row) -> HistoryItem {
        let parameters = HistoryReads.parameters(row[13])
        return HistoryItem(
            jobId: row[0], userId: row[1], effectId: row[2], effectTitle: row[3], prompt: row[4],
            status: JobStatus(rawValue: row[5]) ?? .failed, progress: row[6], createdAt: Date(milliseconds: row[7]),
            updatedAt: Date(milliseconds: row[8]), finishedAt: (row[9] as Int64?).map(Date.init(milliseconds:)), resultKey: row[10],
            thumbnailKey: row[11], originalImageKey: row[12], parameters: parameters, cost: row[14], lastError: row[15], version: row[16]
        )
    }

    /// The WHERE clause of a page: the user, the statuses, the search, and the keyset position.
    struct Filter {
        var userId: String
        var statuses: [String]
        var query: String?
        var after: PageCursor?
        /// Search by reading the user's items rather than asking the index (see
        /// `HistoryDatabase.scanUpTo`).
        var scan = false
        /// With the index: go from its matches (all users') to their items by id, rather than
        /// read the user's items and keep those among the matches. See `chooseIndexOrder`.
        var fromMatches = false
        /// With `fromMatches`, once `readMatchedKeys` ran: the keys of the user's items among the
        /// matches, newest first. The count and the page are taken from them, so each match is
        /// looked up once a request, not once for the count and again for the page.
        private(set) var matchedKeys: [PageCursor]?

        /// A match costs about this many of the user's rows read, when its item is looked up by
        /// id (by the id index, then the item table): 3.5 µs against 0.23 µs, measured on a
        /// history of 300,000 items (`make bench-history`'s).
        static let lookupCostInRowsRead = 15

        init(_ request: ListHistory) {
            userId = request.userId
            statuses = HistoryReads.statuses(of: request)
            query = HistoryReads.query(of: request)
        }

        mutating func after(_ cursor: PageCursor) { after = cursor }

        /// The search's phrase for the trigram index: the query, quoted as one phrase.
        var phrase: String? {
            query.map { "\"" + $0.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }
        }

        /// Whether the index's search goes from the matches (`fromMatches`): when looking up every
        /// match (of every user) costs less than reading the user's `userItems`. Both read the
        /// index's matches whole; a rare phrase in a long history was then 15 ms of reading the
        /// history for one item, and is now a lookup. The matches are counted first (the index's
        /// count of a phrase costs a fraction of either way).
        mutating func chooseIndexOrder(_ db: Database, userItems: Int) throws {
            guard !scan, let query, query.count >= 3, let phrase else { return }
            let matches = try Int.fetchOne(
                db.cachedStatement(sql: "SELECT COUNT(*) FROM item_search WHERE item_search MATCH ?"), arguments: [phrase]
            ) ?? 0
            fromMatches = matches * Self.lookupCostInRowsRead < userItems
            if fromMatches { try readMatchedKeys(db) }
        }

        /// Reads `matchedKeys`: every item of the user (in the statuses) among the matches, by
        /// id, ordered as pages are (creation time, then job id, as SQLite compares them: the
        /// id's bytes).
        mutating func readMatchedKeys(_ db: Database) throws {
            let (sql, arguments) = clause(counting: true)
            let keys = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT createdAt, jobId FROM item WHERE " + sql), arguments: StatementArguments(arguments)
            ).map { PageCursor(createdAt: $0[0], jobId: $0[1]) }
            matchedKeys = keys.sorted { Self.isBefore($1, $0) }
        }

        /// Whether `a` comes before `b` in (createdAt, jobId) order, as SQLite orders the rows.
        static func isBefore(_ a: PageCursor, _ b: PageCursor) -> Bool {
            a.createdAt != b.createdAt ? a.createdAt < b.createdAt : a.jobId.utf8.lexicographicallyPrecedes(b.jobId.utf8)
        }

        func clause(counting: Bool) -> (String, [(any DatabaseValueConvertible)?]) {
            // `+userId` keeps SQLite from reading the user's items by the primary key: it then
            // takes the matches' ids and looks each up (`fromMatches`).
            var sql = fromMatches ? "+userId = ?" : "userId = ?"
            var arguments: [(any DatabaseValueConvertible)?] = [userId]
            if !statuses.isEmpty {
                sql += " AND status IN (" + statuses.map { _ in "?" }.joined(separator: ",") + ")"
                arguments += statuses
            }
            if let query {
                if scan || query.count < 3 {
                    // A short history, or a query shorter than a trigram: read the user's items.
                    sql += " AND (history_contains(prompt, ?) OR history_contains(effectTitle, ?))"
                    arguments += [query.lowercased(), query.lowercased()]
                } else {
                    // The trigram index finds any substring of three characters or more,
                    // case-insensitively; the query is one quoted phrase.
                    sql += " AND id IN (SELECT rowid FROM item_search WHERE item_search MATCH ?)"
                    arguments.append(phrase)
                }
            }
            if let after, !counting {
                sql += " AND (createdAt, jobId) < (?, ?)"
                arguments += [after.createdAt, after.jobId]
            }
            return (sql, arguments)
        }

        /// The user's items in `statuses` (all when empty), from the counts kept per user and
        /// status as items change: no scan of a long history.
        static func storedCount(_ db: Database, userId: String, statuses: [String]) throws -> Int {
            var sql = "SELECT COALESCE(SUM(count), 0) FROM item_count WHERE userId = ?"
            var arguments: [(any DatabaseValueConvertible)?] = [userId]
            if !statuses.isEmpty {
                sql += " AND status IN (" + statuses.map { _ in "?" }.joined(separator: ",") + ")"
                arguments += statuses
            }
            return try Int.fetchOne(db.cachedStatement(sql: sql), arguments: StatementArguments(arguments)) ?? 0
        }

        func count(_ db: Database) throws -> Int {
            if query == nil { return try Self.storedCount(db, userId: userId, statuses: statuses) }
            if let matchedKeys { return matchedKeys.count }
            let (sql, arguments) = clause(counting: true)
            return try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM item WHERE " + sql), arguments: StatementArguments(arguments)) ?? 0
        }

        func items(_ db: Database, limit: Int, offset: Int) throws -> [HistoryItem] {
            // Each row read from the statement as it steps (a cursor), not copied first: its
            // columns go straight from SQLite into the item (the copies and their generic decoding
            // were a tenth of the machine serving pages, perf of `make bench-history`).
            try Array(rows(db, limit: limit, offset: offset).cursor.map(HistoryDatabase.item(from:)))
        }

        /// The page's rows, `itemColumns` each, newest first, as the statement steps, and the
        /// statement (its current row is the cursor's).
        func rows(_ db: Database, limit: Int, offset: Int) throws -> (cursor: RowCursor, statement: Statement) {
            if let matchedKeys { return try rows(db, of: matchedKeys, limit: limit, offset: offset) }
            let (sql, arguments) = clause(counting: false)
            let statement = try db.cachedStatement(
                sql: "SELECT \(HistoryDatabase.itemColumns) FROM item WHERE " + sql + " ORDER BY createdAt DESC, jobId DESC LIMIT ? OFFSET ?"
            )
            return (try Row.fetchCursor(statement, arguments: StatementArguments(arguments + [limit, offset])), statement)
        }

        /// The page's rows out of `keys` (newest first): those after the cursor, from `offset`,
        /// at most `limit`, each read by its primary key.
        private func rows(_ db: Database, of keys: [PageCursor], limit: Int, offset: Int) throws -> (cursor: RowCursor, statement: Statement) {
            let start = after.map { after in keys.firstIndex { Self.isBefore($0, after) } ?? keys.count } ?? 0
            let page = keys.dropFirst(start + offset).prefix(limit)
            var arguments: [(any DatabaseValueConvertible)?] = []
            for key in page { arguments += [key.createdAt, key.jobId] }
            arguments.append(userId)
            // The keys first, each item then found by its primary key (`IN` over the keys made
            // SQLite read the user's items instead). Up to a page of keys (101 at most): a
            // statement of its own rather than one cached per length.
            let keys = page.isEmpty ? "SELECT NULL AS column1, NULL AS column2 WHERE 0" : "VALUES " + page.map { _ in "(?, ?)" }.joined(separator: ", ")
            let statement = try db.makeStatement(sql: """
                SELECT \(HistoryDatabase.itemColumns) FROM (\(keys)) AS page
                CROSS JOIN item ON item.userId = ? AND item.createdAt = page.column1 AND item.jobId = page.column2
                ORDER BY item.createdAt DESC, item.jobId DESC
                """)
            return (try Row.fetchCursor(statement, arguments: StatementArguments(arguments)), statement)
        }
    }
}
