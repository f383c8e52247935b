import Foundation
import Logging
import Messages
import NIOCore
import PostgresNIO

extension PostgresHistoryStore {
    /// `history.page`'s answer, written straight from its row: a page, or a small search, is one
    /// row of the total and the records of the items' columns (`RenderedPage`,
    /// `RenderedScanSearch`), and each head is written from its record's bytes (`WrittenPage`,
    /// `PostgresPageRecord`) with no `HistoryItem` and no cell per column in between. Read as a
    /// cell per column, a first page of 50 was 969 cells, and postgres-nio's making and releasing
    /// them (with the items made of them) was most of history's time per page (perf of
    /// `make bench-history STORE=postgres`: history's PostgreSQL thread at a third of the
    /// machine, a third of that in retain and release). A page in month sections, and a search
    /// of a user with more items than a scan takes (its statement is planned for its pattern),
    /// are written from their items (`page(_:)`).
    public func renderedPage(_ request: ListHistory) async throws -> RenderedHistoryPage {
        guard !request.groupByMonth else { return RenderedHistoryPage(try await page(request)) }
        let (after, statuses, pattern, offset) = try pageParameters(request)
        let logger = logger
        var (records, total): (ByteBuffer, Int)
        if let pattern {
            // As `page(_:)` searches: no record is no match, or a user with more items than the
            // scan takes.
            let bindings = searchBindings(request, statuses: statuses, pattern: pattern, after: after, offset: offset)
            let scanUpTo = scanUpTo
            let scanned: (ByteBuffer, Int)? = try await database.connection { db in
                let scanned = try await Self.pageRow(db.execute(RenderedScanSearch(bindings: bindings), logger: logger))
                guard scanned.records.readableBytes == 0 else { return scanned }
                var size: Int64 = 0
                for try await items in try await db.execute(ItemCount(userId: request.userId), logger: logger) { size = items }
                return size > scanUpTo ? nil : scanned
            }
            guard let scanned else { return RenderedHistoryPage(try await page(request)) }
            (records, total) = scanned
        } else {
            let shape = PageShape(statuses: !statuses.isEmpty, cursor: after != nil)
            let bindings = Self.pageBindings(request, statuses: statuses, after: after, offset: offset)
            (records, total) = try await database.connection { db in
                func read<Shape: PageShape.Named>(_: Shape.Type) async throws -> (ByteBuffer, Int) {
                    try await Self.pageRow(db.execute(RenderedPage<Shape>(bindings: bindings), logger: logger))
                }
                switch (shape.statuses, shape.cursor) {
                case (false, false): return try await read(PageShape.Top.self)
                case (true, false): return try await read(PageShape.TopByStatus.self)
                case (false, true): return try await read(PageShape.After.self)
                case (true, true): return try await read(PageShape.AfterByStatus.self)
                }
            }
        }
        if records.readableBytes == 0, offset > 0 || after != nil { total = try await count(request, statuses: statuses, pattern: pattern) }
        var written = WrittenPage(limit: request.limit)
        try PostgresPageRecord.append(records, to: &written)
        return written.page(total: total, request: request, signer: signer)
    }

    /// The records and the total of a page that is one row: the total (NULL: none matched) and
    /// the items' records one after the other (`PostgresPageRecord.aggregate`; empty for none).
    /// They are only taken here, on the connection's event loop; `renderedPage` reads them and
    /// writes the heads after the connection is handed back. A row per item cost postgres-nio an
    /// `await` and a row's bookkeeping each, on the event loop that all of history's connections
    /// share (perf of `make bench-history STORE=postgres`: that thread the machine's busiest, a
    /// third of it in the row sequence's locks, executor checks and releases).
    static func pageRow<Rows: AsyncSequence & Sendable>(_ rows: Rows) async throws -> (records: ByteBuffer, total: Int) where Rows.Element == PostgresRow {
        var page: (ByteBuffer, Int)?
        for try await row in rows {
            var cells = row.makeIterator()
            guard page == nil, let total = cells.next(), let records = cells.next() else {
                throw PostgresPageMalformed(reason: "the page is not one row of a total and its records")
            }
            page = (records.bytes ?? ByteBuffer(), Int(try total.decode(Int64?.self) ?? 0))
        }
        guard let page else { throw PostgresPageMalformed(reason: "the page has no row") }
        return page
    }

    /// A page of one shape, one row of the total and the items' records
    /// (`PageShape.recordSQL`), prepared once per connection.
    struct RenderedPage<Shape: PageShape.Named>: BoundStatement {
        static var name: String { "history_rendered_page_\(Shape.self)" }
        static var sql: String { Shape.shape.recordSQL }
        var bindings: PostgresBindings
    }

    /// `ScanSearch`'s page as one row, as `PageShape.recordSQL`'s: the total of the matches
    /// (NULL when the page has none) and the items' records, made after the limit and the offset.
    struct RenderedScanSearch: BoundStatement {
        static let name = "history_rendered_search_scan"
        static let sql = """
            SELECT max(total), \(PostgresPageRecord.aggregate) FROM (
                \(ScanSearch.statement(selecting: "*", from: "count(*) OVER () AS total, \(PostgresPageRecord.columns)"))
            ) AS page
            """
        var bindings: PostgresBindings
    }
}

/// One item's record of a rendered page (`PostgresHistoryStore.RenderedPage`), as PostgreSQL
/// sends a record in binary (`record_send`): its column count, then each column's type, length
/// (-1 for NULL) and bytes. Text is its UTF-8 bytes; `bigint` and `double precision` are 8 bytes,
/// big-endian.
struct PostgresPageRecord: PageRow {
    /// The record's columns, in `PageColumn`'s order.
    static let columns = """
        job_id, effect_id, effect_title, prompt, status, progress, created_at, result_key, thumbnail_key, image_key, parameters, cost, last_error
        """
    /// A page's records as one value, made from its rows (`columns`, newest first): each row's
    /// record as `record_send` writes it, back to back in one `bytea` (NULL for no row). Each
    /// record is sent while its row is the aggregate's input (its memory freed row by row), not
    /// kept whole to the end as an array of records would be (docs/history.md).
    static let aggregate = "string_agg(record_send(ROW(\(columns))), ''::bytea ORDER BY created_at DESC, job_id DESC)"
    /// Each column's type (`pg_type`'s oid): text 25, bigint 20, double precision 701.
    private static let types: [UInt32] = PageColumn.allCases.map { column in
        switch column {
        case .progress: 701
        case .createdAt, .cost: 20
        default: 25
        }
    }

    private let bytes: UnsafeRawBufferPointer
    /// Each column's start in `bytes` and its length (-1: NULL), in `PageColumn`'s order.
    private let fields: UnsafeMutableBufferPointer<Int>

    func text<T>(_ column: PageColumn, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T? {
        let (start, length) = field(column)
        guard length >= 0 else { return nil }
        return body(UnsafeBufferPointer(rebasing: bytes.assumingMemoryBound(to: UInt8.self)[start..<start + length]))
    }

    func int64(_ column: PageColumn) -> Int64 {
        let (start, length) = field(column)
        return length == 8 ? Int64(bigEndian: bytes.loadUnaligned(fromByteOffset: start, as: Int64.self)) : 0
    }

    func double(_ column: PageColumn) -> Double {
        let (start, length) = field(column)
        return length == 8 ? Double(bitPattern: UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: start, as: UInt64.self))) : 0
    }

    private func field(_ column: PageColumn) -> (start: Int, length: Int) {
        (fields[2 * column.rawValue], fields[2 * column.rawValue + 1])
    }

    /// Writes the item of each record in `records` (back to back, as `aggregate` makes them)
    /// into `written`. Lengths are checked against the bytes and the columns against `types`, so
    /// a statement and this reader out of step fail the page instead of reading past the buffer.
    static func append(_ records: ByteBuffer, to written: inout WrittenPage) throws {
        try records.withUnsafeReadableBytes { bytes in
            try withUnsafeTemporaryAllocation(of: Int.self, capacity: 2 * types.count) { fields in
                var reader = Reader(bytes: bytes)
                while reader.offset < bytes.count {
                    guard try reader.int32() == types.count else { throw PostgresPageMalformed(reason: "a record of another shape") }
                    for (index, type) in types.enumerated() {
                        guard UInt32(bitPattern: try reader.int32()) == type else { throw PostgresPageMalformed(reason: "column \(index) of another type") }
                        let length = Int(try reader.int32())
                        guard type == 25 || length == 8 else { throw PostgresPageMalformed(reason: "column \(index) of \(length) bytes") }
                        fields[2 * index] = reader.offset
                        fields[2 * index + 1] = length
                        if length > 0 { try reader.skip(length) }
                    }
                    _ = written.append(PostgresPageRecord(bytes: bytes, fields: fields))
                }
            }
        }
    }

    /// Reads big-endian integers off `bytes`, from `offset` on.
    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0

        mutating func int32() throws -> Int32 {
            let start = offset
            try skip(4)
            return Int32(bigEndian: bytes.loadUnaligned(fromByteOffset: start, as: Int32.self))
        }

        mutating func skip(_ count: Int) throws {
            guard count >= 0, count <= bytes.count - offset else { throw PostgresPageMalformed(reason: "a length past the end") }
            offset += count
        }
    }
}

/// A rendered page's row not as its statement makes it: the statement and its reader out of step.
struct PostgresPageMalformed: Error, CustomStringConvertible {
    var reason: String
    var description: String { "history's page row is malformed: \(reason)" }
}
