import Foundation
import Messages
import NIOCore
import Storage

extension PostgresHistoryStore {
    /// `history.page`'s answer: the page of `page(_:)` with each item's head written straight from
    /// the row's cells as they are read (their text copied from postgres-nio's buffers into the
    /// JSON), with no `HistoryItem` and no string per column in between, as the SQLite store does
    /// it. Exactly `RenderedHistoryPage(page(request))` (`HistoryRenderedPageTests`). A page in
    /// month sections is cut from its items (`MonthSections`), and takes that path.
    public func renderedPage(_ request: ListHistory) async throws -> RenderedHistoryPage {
        if request.groupByMonth { return RenderedHistoryPage(try await page(request)) }
        let (written, total) = try await pageRows(request, as: WrittenItems.self)
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
    struct WrittenItems: PageReader {
        let limit: Int
        var heads: RenderedHistoryPage.Heads
        var statuses: [HistoryStatus] = []
        var resultKeys: [String] = []
        var thumbnailKeys: [String] = []
        var hasMore = false
        /// The last written item's position, for the next page's cursor.
        var last: (createdAt: Int64, jobId: String)?

        init(limit: Int) {
            self.limit = limit
            heads = .init(capacity: limit)
            statuses.reserveCapacity(limit)
            resultKeys.reserveCapacity(limit)
            thumbnailKeys.reserveCapacity(limit)
        }

        var count: Int { heads.count + (hasMore ? 1 : 0) }

        mutating func read(_ cells: inout PostgresCells) throws {
            guard heads.count < limit else {
                hasMore = true
                return
            }
            // The cells in `itemColumns`' order; the head's keys come in another.
            let jobId = try cells.textBytes()
            try cells.skip()  // user_id
            let effectId = try cells.textBytes(), effectTitle = try cells.textBytes(), prompt = try cells.textBytes()
            let status = JobStatus(rawValue: try cells.string()) ?? .failed
            let progress = try cells.double(), createdAt = try cells.int64()
            try cells.skip()  // updated_at
            try cells.skip()  // finished_at
            let resultKey = try cells.textBytes(), thumbnailKey = try cells.textBytes(), imageKey = try cells.textBytes()
            let parameters = try cells.textBytes(), cost = try cells.int(), lastError = try cells.textBytes()
            let appStatus = HistoryStatus(status)
            heads.write { out in
                out.raw("{\"createdAt\":")
                out.date(Date(milliseconds: createdAt))
                out.raw(",\"credits\":")
                out.integer(cost)
                out.raw(",\"effectId\":")
                Self.string(effectId, &out)
                out.raw(",\"effectTitle\":")
                Self.string(effectTitle, &out)
                if status == .failed, let lastError {
                    out.raw(",\"error\":")
                    Self.string(lastError, &out)
                }
                out.raw(",\"id\":")
                Self.string(jobId, &out)
                out.raw(",\"originalImageKey\":")
                Self.string(imageKey, &out)
                out.raw(",\"parameters\":")
                // Most edits have none; the others are read as `HistoryReads.parameters` reads them.
                if let parameters, parameters.readableBytesView.elementsEqual("{}".utf8) == false {
                    out.numbers(HistoryReads.parameters(String(buffer: parameters)))
                } else {
                    out.raw("{}")
                }
                if appStatus == .processing {
                    out.raw(",\"progress\":")
                    out.number(progress)
                }
                if let prompt {
                    out.raw(",\"prompt\":")
                    Self.string(prompt, &out)
                }
            }
            statuses.append(appStatus)
            let completed = status == .completed
            resultKeys.append(completed ? resultKey.map { String(buffer: $0) } ?? "" : "")
            thumbnailKeys.append(completed ? thumbnailKey.map { String(buffer: $0) } ?? "" : "")
            if heads.count == limit { last = (createdAt, jobId.map { String(buffer: $0) } ?? "") }
        }

        /// A text cell as a JSON string (`""` when NULL, which no column written here is).
        private static func string(_ text: ByteBuffer?, _ out: inout JSONBytes) {
            guard let text else { return out.raw("\"\"") }
            text.withUnsafeReadableBytes { out.string(utf8: $0.assumingMemoryBound(to: UInt8.self)) }
        }
    }
}
