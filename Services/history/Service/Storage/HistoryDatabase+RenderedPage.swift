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
            try WrittenRows(filter.rows(db, limit: limit, offset: offset), limit: limit - 1)
        }
        let next = written.hasMore ? written.last.map { HistoryReads.nextCursor(createdAt: $0.createdAt, jobId: $0.jobId, request: request, signer: signer) } : nil
        let (text, ends) = written.heads.finish()
        return RenderedHistoryPage(
            headText: text, headEnds: ends, statuses: written.statuses, resultKeys: written.resultKeys, thumbnailKeys: written.thumbnailKeys,
            totalCount: total, hasMore: written.hasMore, nextCursor: next, sections: nil
        )
    }

    /// Up to `limit` rows of `itemColumns` written as `RenderedHistoryPage(_:)` writes items
    /// (`HistoryItem.writeHead`, the app status, the keys linked once completed), and whether a
    /// row followed them.
    struct WrittenRows: Sendable {
        var heads: RenderedHistoryPage.Heads
        var statuses: [HistoryStatus] = []
        var resultKeys: [String] = []
        var thumbnailKeys: [String] = []
        var hasMore = false
        /// The last written item's position, for the next page's cursor.
        var last: (createdAt: Int64, jobId: String)?

        init(_ rows: (cursor: RowCursor, statement: Statement), limit: Int) throws {
            heads = .init(capacity: limit)
            statuses.reserveCapacity(limit)
            resultKeys.reserveCapacity(limit)
            thumbnailKeys.reserveCapacity(limit)
            let statement = rows.statement.sqliteStatement
            while try rows.cursor.next() != nil {
                if heads.count == limit {
                    hasMore = true
                    break
                }
                write(statement, isLast: heads.count == limit - 1)
            }
        }

        /// The current row of `statement`, in `itemColumns`' order.
        private mutating func write(_ statement: SQLiteStatement, isLast: Bool) {
            let status = JobStatus(rawValue: Self.text(statement, 5) ?? "") ?? .failed
            let appStatus = HistoryStatus(status)
            let createdAt = sqlite3_column_int64(statement, 7)
            heads.write { out in Self.writeHead(statement, status: status, appStatus: appStatus, createdAt: createdAt, &out) }
            statuses.append(appStatus)
            let completed = status == .completed
            resultKeys.append(completed ? Self.text(statement, 10) ?? "" : "")
            thumbnailKeys.append(completed ? Self.text(statement, 11) ?? "" : "")
            if isLast { last = (createdAt, Self.text(statement, 0) ?? "") }
        }

        /// The head, key by key as `HistoryItem.writeHead` writes it.
        private static func writeHead(_ statement: SQLiteStatement, status: JobStatus, appStatus: HistoryStatus, createdAt: Int64, _ out: inout JSONBytes) {
            out.raw("{\"createdAt\":")
            out.date(Date(milliseconds: createdAt))
            out.raw(",\"credits\":")
            out.integer(Int(sqlite3_column_int64(statement, 14)))
            out.raw(",\"effectId\":")
            string(statement, 2, &out)
            out.raw(",\"effectTitle\":")
            string(statement, 3, &out)
            if status == .failed, sqlite3_column_type(statement, 15) != SQLITE_NULL {
                out.raw(",\"error\":")
                string(statement, 15, &out)
            }
            out.raw(",\"id\":")
            string(statement, 0, &out)
            out.raw(",\"originalImageKey\":")
            string(statement, 12, &out)
            out.raw(",\"parameters\":")
            // Most edits have none; the others are read as `HistoryReads.parameters` reads them.
            if Self.text(statement, 13, { $0.elementsEqual("{}".utf8) }) ?? true {
                out.raw("{}")
            } else {
                out.numbers(HistoryReads.parameters(Self.text(statement, 13)))
            }
            if appStatus == .processing {
                out.raw(",\"progress\":")
                out.number(sqlite3_column_double(statement, 6))
            }
            if sqlite3_column_type(statement, 4) != SQLITE_NULL {
                out.raw(",\"prompt\":")
                string(statement, 4, &out)
            }
        }

        /// Column `index`'s text as `body` reads it, nil when NULL. Up to its first NUL byte, as
        /// GRDB reads a `String` (`String(cString:)`), so that every route shows the same text.
        /// The page's text mends any invalid UTF-8 head by head (`RenderedHistoryPage.Heads`), as
        /// a string of each column did.
        private static func text<T>(_ statement: SQLiteStatement, _ index: Int32, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T? {
            guard sqlite3_column_type(statement, index) != SQLITE_NULL, let start = sqlite3_column_text(statement, index) else { return nil }
            let count = Int(sqlite3_column_bytes(statement, index))
            let buffer = UnsafeBufferPointer(start: start, count: count)
            return body(UnsafeBufferPointer(rebasing: buffer[..<(buffer.firstIndex(of: 0) ?? count)]))
        }

        /// Column `index`'s text as a string, nil when NULL.
        private static func text(_ statement: SQLiteStatement, _ index: Int32) -> String? {
            text(statement, index) { String(decoding: $0, as: UTF8.self) }
        }

        /// Column `index` as a JSON string (`""` when NULL, which no column written here is).
        private static func string(_ statement: SQLiteStatement, _ index: Int32, _ out: inout JSONBytes) {
            if text(statement, index, { out.string(utf8: $0) }) == nil { out.raw("\"\"") }
        }
    }
}
