import Foundation
import GRDB
import GRDBSQLite
import Messages

extension HistoryDatabase {
    /// `history.page`'s answer: the page of `page(_:)` with each item's head written straight from
    /// the statement's columns as it steps (their text copied from SQLite's buffers into the
    /// JSON), with no `HistoryItem` and no string per column in between. Exactly
    /// `RenderedHistoryPage(page(request))` (`HistoryRenderedPageTests`). A page in month sections
    /// is cut from its items (`MonthSections`), and takes that path.
    public func renderedPage(_ request: ListHistory) async throws -> RenderedHistoryPage {
        if request.groupByMonth { return RenderedHistoryPage(try await page(request)) }
        let (written, total) = try await pageRows(request) { filter, db, limit, offset in
            let rows = try filter.rows(db, limit: limit, offset: offset)
            var written = WrittenPage(limit: limit - 1)
            let row = SQLitePageRow(statement: rows.statement.sqliteStatement)
            while try rows.cursor.next() != nil, written.append(row) {}
            return written
        }
        return written.page(total: total, request: request, signer: signer)
    }
}

/// The current row of a statement of `HistoryDatabase.itemColumns`, as `WrittenPage` reads it:
/// each column's text straight from SQLite's buffer.
struct SQLitePageRow: PageRow {
    let statement: SQLiteStatement

    /// Where `column` is in `itemColumns`.
    private static func index(_ column: PageColumn) -> Int32 {
        switch column {
        case .jobId: 0
        case .effectId: 2
        case .effectTitle: 3
        case .prompt: 4
        case .status: 5
        case .progress: 6
        case .createdAt: 7
        case .resultKey: 10
        case .thumbnailKey: 11
        case .imageKey: 12
        case .parameters: 13
        case .cost: 14
        case .lastError: 15
        }
    }

    /// Up to the column's first NUL byte, as GRDB reads a `String` (`String(cString:)`), so that
    /// every route shows the same text. The page's text mends any invalid UTF-8 head by head
    /// (`RenderedHistoryPage.Heads`), as a string of each column did.
    func text<T>(_ column: PageColumn, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T? {
        let index = Self.index(column)
        guard sqlite3_column_type(statement, index) != SQLITE_NULL, let start = sqlite3_column_text(statement, index) else { return nil }
        let count = Int(sqlite3_column_bytes(statement, index))
        let buffer = UnsafeBufferPointer(start: start, count: count)
        return body(UnsafeBufferPointer(rebasing: buffer[..<(buffer.firstIndex(of: 0) ?? count)]))
    }

    func int64(_ column: PageColumn) -> Int64 { sqlite3_column_int64(statement, Self.index(column)) }

    func double(_ column: PageColumn) -> Double { sqlite3_column_double(statement, Self.index(column)) }
}
