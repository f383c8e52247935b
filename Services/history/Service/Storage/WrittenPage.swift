import Foundation
import HistoryCore
import Messages

/// The columns a page's item is written from, by what they hold: each store's row reads them from
/// its own columns (`SQLitePageRow`, `PostgresPageRecord`).
enum PageColumn: Int, CaseIterable {
    case jobId, effectId, effectTitle, prompt, status, progress, createdAt, resultKey, thumbnailKey, imageKey, parameters, cost, lastError
}

/// One item's row of a page as `WrittenPage` reads it, whichever store it comes from: text as its
/// UTF-8 bytes, numbers as numbers.
protocol PageRow {
    /// The text of `column` as `body` reads it; nil when NULL.
    func text<T>(_ column: PageColumn, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T?
    func int64(_ column: PageColumn) -> Int64
    func double(_ column: PageColumn) -> Double
}

extension PageRow {
    /// The text of `column` as a string, nil when NULL.
    func string(_ column: PageColumn) -> String? {
        text(column) { String(decoding: $0, as: UTF8.self) }
    }

    func isNull(_ column: PageColumn) -> Bool {
        text(column) { _ in () } == nil
    }
}

/// `history.page`'s answer written straight from a store's rows as they are read: each item's
/// head written key by key as `HistoryItem.writeHead` writes it, its app status, and its keys
/// linked once completed, with no `HistoryItem` and no string per column in between. Exactly
/// `RenderedHistoryPage(page)` of the same rows (`HistoryRenderedPageTests`, on both stores).
struct WrittenPage: Sendable {
    private var heads: RenderedHistoryPage.Heads
    private var statuses: [HistoryStatus] = []
    private var resultKeys: [String] = []
    private var thumbnailKeys: [String] = []
    private let limit: Int
    /// Whether a row came after the page's last item.
    private(set) var hasMore = false
    /// The last written item's position, for the next page's cursor.
    private var last: (createdAt: Int64, jobId: String)?

    /// A page of up to `limit` items.
    init(limit: Int) {
        self.limit = limit
        heads = .init(capacity: limit)
        statuses.reserveCapacity(limit)
        resultKeys.reserveCapacity(limit)
        thumbnailKeys.reserveCapacity(limit)
    }

    var isEmpty: Bool { heads.count == 0 }

    /// Writes `row` as the next item; false, and `hasMore`, once the page is full (the row is the
    /// one fetched past the limit to tell whether more follow).
    mutating func append(_ row: some PageRow) -> Bool {
        guard heads.count < limit else {
            hasMore = true
            return false
        }
        let status = JobStatus(rawValue: row.string(.status) ?? "") ?? .failed
        let appStatus = HistoryStatus(status)
        let createdAt = row.int64(.createdAt)
        heads.write { out in Self.writeHead(row, status: status, appStatus: appStatus, createdAt: createdAt, &out) }
        statuses.append(appStatus)
        let completed = status == .completed
        resultKeys.append(completed ? row.string(.resultKey) ?? "" : "")
        thumbnailKeys.append(completed ? row.string(.thumbnailKey) ?? "" : "")
        if heads.count == limit { last = (createdAt, row.string(.jobId) ?? "") }
        return true
    }

    /// The answer, with `total` items in the whole filtered set, and the next page's cursor when
    /// more follow.
    func page(total: Int, request: ListHistory, signer: TokenSigner) -> RenderedHistoryPage {
        let next = hasMore ? last.map { HistoryReads.nextCursor(createdAt: $0.createdAt, jobId: $0.jobId, request: request, signer: signer) } : nil
        let (text, ends) = heads.finish()
        return RenderedHistoryPage(
            headText: text, headEnds: ends, statuses: statuses, resultKeys: resultKeys, thumbnailKeys: thumbnailKeys, totalCount: total,
            hasMore: hasMore, nextCursor: next, sections: nil
        )
    }

    /// The head, key by key as `HistoryItem.writeHead` writes it.
    private static func writeHead(_ row: some PageRow, status: JobStatus, appStatus: HistoryStatus, createdAt: Int64, _ out: inout JSONBytes) {
        out.raw("{\"createdAt\":")
        out.date(Date(milliseconds: createdAt))
        out.raw(",\"credits\":")
        out.integer(Int(row.int64(.cost)))
        out.raw(",\"effectId\":")
        string(row, .effectId, &out)
        out.raw(",\"effectTitle\":")
        string(row, .effectTitle, &out)
        if status == .failed, !row.isNull(.lastError) {
            out.raw(",\"error\":")
            string(row, .lastError, &out)
        }
        out.raw(",\"id\":")
        string(row, .jobId, &out)
        out.raw(",\"originalImageKey\":")
        string(row, .imageKey, &out)
        out.raw(",\"parameters\":")
        // Most edits have none; the others are read as `HistoryReads.parameters` reads them.
        if row.text(.parameters, { $0.elementsEqual("{}".utf8) }) ?? true {
            out.raw("{}")
        } else {
            out.numbers(HistoryReads.parameters(row.string(.parameters)))
        }
        if appStatus == .processing {
            out.raw(",\"progress\":")
            out.number(row.double(.progress))
        }
        if !row.isNull(.prompt) {
            out.raw(",\"prompt\":")
            string(row, .prompt, &out)
        }
    }

    /// Column `column` as a JSON string (`""` when NULL, which no column written here is).
    private static func string(_ row: some PageRow, _ column: PageColumn, _ out: inout JSONBytes) {
        if row.text(column, { out.string(utf8: $0) }) == nil { out.raw("\"\"") }
    }
}
