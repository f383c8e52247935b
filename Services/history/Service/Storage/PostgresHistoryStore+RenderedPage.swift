import Foundation
import Logging
import Messages
import NIOCore
import PostgresNIO

extension PostgresHistoryStore {
    /// `history.page`'s answer, written straight from one row: the total, and the page's items as
    /// one array of records (`RenderedPage`), each item's head written from its record's bytes
    /// (`WrittenPage`) with no `HistoryItem` and no cell per column in between. Read as a row of
    /// cells per item, a first page of 50 was 969 cells, and postgres-nio's making and releasing
    /// them (with the items made of them) was most of history's time per page (perf of `make
    /// bench-history STORE=postgres`: history's PostgreSQL thread at a third of the machine, a
    /// third of that in retain and release). A search and a page in month sections are written
    /// from their items (`page(_:)`).
    public func renderedPage(_ request: ListHistory) async throws -> RenderedHistoryPage {
        guard !request.groupByMonth, HistoryReads.query(of: request) == nil else { return RenderedHistoryPage(try await page(request)) }
        let after = try HistoryReads.cursor(of: request, signer: signer)
        let statuses = HistoryReads.statuses(of: request)
        let offset = after == nil ? request.offset : 0
        let shape = PageShape(statuses: !statuses.isEmpty, cursor: after != nil)
        let bindings = Self.pageBindings(request, statuses: statuses, after: after, offset: offset)
        let logger = logger
        var (written, total) = try await database.connection { db in
            func read<Shape: PageShape.Named>(_: Shape.Type) async throws -> (WrittenPage, Int) {
                var written = WrittenPage(limit: request.limit)
                var total = 0
                for try await row in try await db.execute(RenderedPage<Shape>(bindings: bindings), logger: logger) {
                    var cells = row.makeIterator()
                    guard let count = try cells.next()?.decode(Int64.self), let items = cells.next()?.bytes else {
                        throw PostgresPageMalformed(reason: "the row is not a total and an array")
                    }
                    total = Int(count)
                    try PostgresPageRecord.append(items, to: &written)
                }
                return (written, total)
            }
            switch (shape.statuses, shape.cursor) {
            case (false, false): return try await read(PageShape.Top.self)
            case (true, false): return try await read(PageShape.TopByStatus.self)
            case (false, true): return try await read(PageShape.After.self)
            case (true, true): return try await read(PageShape.AfterByStatus.self)
            }
        }
        if written.isEmpty, offset > 0 || after != nil { total = try await count(request, statuses: statuses, pattern: nil) }
        return written.page(total: total, request: request, signer: signer)
    }

    /// A page of one shape as one row: the total (as `PageShape.sql`'s), then an array of a
    /// record per item (`PostgresPageRecord.columns`), newest first; prepared once per connection.
    struct RenderedPage<Shape: PageShape.Named>: PostgresPreparedStatement {
        typealias Row = PostgresRow
        static var name: String { "history_rendered_page_\(Shape.self)" }
        static var sql: String { Shape.shape.sql(selecting: "ARRAY(SELECT ROW(\(PostgresPageRecord.columns))", closing: ")") }
        var bindings: PostgresBindings

        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
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

    /// Writes each record of `array` (`array_send`: dimensions, flags, element type, each
    /// dimension's size and lower bound, then each element's length and bytes) into `written`.
    /// Lengths are checked against the bytes and the columns against `types`, so a statement and
    /// this reader out of step fail the page instead of reading past the buffer.
    static func append(_ array: ByteBuffer, to written: inout WrittenPage) throws {
        try array.withUnsafeReadableBytes { bytes in
            try withUnsafeTemporaryAllocation(of: Int.self, capacity: 2 * types.count) { fields in
                var array = Reader(bytes: bytes, offset: 0, end: bytes.count)
                let dimensions = try array.int32()
                guard dimensions != 0 else { return }
                guard dimensions == 1 else { throw PostgresPageMalformed(reason: "an array of \(dimensions) dimensions") }
                _ = try array.int32()  // flags: whether it holds NULLs
                _ = try array.int32()  // element type
                let count = try array.int32()
                _ = try array.int32()  // lower bound
                for _ in 0..<max(0, count) {
                    let length = Int(try array.int32())
                    guard length >= 0 else { throw PostgresPageMalformed(reason: "a NULL record") }
                    var record = Reader(bytes: bytes, offset: array.offset, end: try array.skip(length))
                    guard try record.int32() == types.count else { throw PostgresPageMalformed(reason: "a record of another shape") }
                    for (index, type) in types.enumerated() {
                        guard UInt32(bitPattern: try record.int32()) == type else { throw PostgresPageMalformed(reason: "column \(index) of another type") }
                        let length = Int(try record.int32())
                        guard type == 25 || length == 8 else { throw PostgresPageMalformed(reason: "column \(index) of \(length) bytes") }
                        fields[2 * index] = record.offset
                        fields[2 * index + 1] = length
                        if length > 0 { _ = try record.skip(length) }
                    }
                    guard written.append(PostgresPageRecord(bytes: bytes, fields: fields)) else { return }
                }
            }
        }
    }

    /// Reads big-endian integers and spans from `offset` up to `end` of `bytes`.
    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset: Int
        let end: Int

        mutating func int32() throws -> Int32 {
            let start = offset
            _ = try skip(4)
            return Int32(bigEndian: bytes.loadUnaligned(fromByteOffset: start, as: Int32.self))
        }

        /// Moves past `count` bytes; returns where they end.
        mutating func skip(_ count: Int) throws -> Int {
            guard count >= 0, count <= end - offset else { throw PostgresPageMalformed(reason: "a length past the end") }
            offset += count
            return offset
        }
    }
}

/// A rendered page's row not as its statement makes it: the statement and its reader out of step.
struct PostgresPageMalformed: Error, CustomStringConvertible {
    var reason: String
    var description: String { "history's page row is malformed: \(reason)" }
}
