import BinaryWire
import Foundation

/// A history item as the app's `HistoryItem` decodes it, written in one pass: keys in sorted order
/// (as `JSONEncoder`'s `.sortedKeys` wrote them), absent values left out. History writes the part
/// before the download URLs (`head`); the gateway, which alone signs URLs, adds them, the status
/// between them, and the closing brace (`tail`).
extension HistoryItem {
    /// The app's status of the item (`processing` for a queued job).
    public var appStatus: HistoryStatus { HistoryStatus(status) }

    /// `{"createdAt":…,"credits":…,"effectId":…,"effectTitle":…,["error":…,]"id":…,
    /// "originalImageKey":…,"parameters":{…}[,"progress":…][,"prompt":…]`: `error` only when it
    /// failed, `progress` only while it runs, `credits` what it used (0 once failed or cancelled:
    /// they were given back).
    public func writeHead(_ out: inout JSONBytes) {
        out.raw("{\"createdAt\":")
        out.date(createdAt)
        out.raw(",\"credits\":")
        out.integer(cost)
        out.raw(",\"effectId\":")
        out.string(effectId)
        out.raw(",\"effectTitle\":")
        out.string(effectTitle)
        if status == .failed, let lastError {
            out.raw(",\"error\":")
            out.string(lastError)
        }
        out.raw(",\"id\":")
        out.string(jobId)
        out.raw(",\"originalImageKey\":")
        out.string(originalImageKey)
        out.raw(",\"parameters\":")
        out.numbers(parameters)
        if appStatus == .processing {
            out.raw(",\"progress\":")
            out.number(progress)
        }
        if let prompt {
            out.raw(",\"prompt\":")
            out.string(prompt)
        }
    }

    /// The result's and the thumbnail's keys the app is given URLs of: only once it completed.
    public var linkedKeys: (result: String?, thumbnail: String?) {
        status == .completed ? (resultKey, thumbnailKey) : (nil, nil)
    }

    /// The rest after `head`: `[,"resultUrl":…],"status":…[,"thumbnailUrl":…]}`.
    public static func writeTail(_ out: inout JSONBytes, status: HistoryStatus, resultURL: String?, thumbnailURL: String?) {
        if let resultURL {
            out.raw(",\"resultUrl\":")
            out.string(resultURL)
        }
        out.raw(",\"status\":")
        out.string(status.rawValue)
        if let thumbnailURL {
            out.raw(",\"thumbnailUrl\":")
            out.string(thumbnailURL)
        }
        out.raw("}")
    }
}

/// A page of history as `history.page` answers it: each item's JSON written by history up to its
/// URLs, for the gateway to finish without decoding or encoding an item again.
@BinaryMessage
public struct RenderedHistoryPage: Codable, Sendable, Equatable {
    /// The items' `HistoryItem.writeHead` texts, newest first, back to back: one string to write,
    /// send and read, not one per item (fifty strings each way were 5% of the machine serving
    /// deep history pages; perf).
    public var headText: String
    /// Where each item's head ends in `headText`, in UTF-8 bytes (it starts where the one before
    /// ends).
    public var headEnds: [Int]
    /// Each item's app status.
    public var statuses: [HistoryStatus]
    /// Each item's result and thumbnail keys ("" when it has none or did not complete).
    public var resultKeys: [String]
    public var thumbnailKeys: [String]
    public var totalCount: Int
    public var hasMore: Bool
    public var nextCursor: String?
    /// With `groupByMonth`: the page's items by month, as indexes into the lists above.
    public var sections: [Section]?

    public struct Section: Codable, Sendable, Equatable {
        public var month: String
        public var title: String
        public var items: [Int]

        public init(month: String, title: String, items: [Int]) {
            self.month = month
            self.title = title
            self.items = items
        }
    }

    public init(
        headText: String, headEnds: [Int], statuses: [HistoryStatus], resultKeys: [String], thumbnailKeys: [String], totalCount: Int,
        hasMore: Bool, nextCursor: String?, sections: [Section]?
    ) {
        self.headText = headText
        self.headEnds = headEnds
        self.statuses = statuses
        self.resultKeys = resultKeys
        self.thumbnailKeys = thumbnailKeys
        self.totalCount = totalCount
        self.hasMore = hasMore
        self.nextCursor = nextCursor
        self.sections = sections
    }

    /// A page of the heads `heads`, one per item.
    public init(
        heads: [String], statuses: [HistoryStatus], resultKeys: [String], thumbnailKeys: [String], totalCount: Int, hasMore: Bool,
        nextCursor: String?, sections: [Section]?
    ) {
        var ends: [Int] = [], end = 0
        for head in heads {
            end += head.utf8.count
            ends.append(end)
        }
        self.init(
            headText: heads.joined(), headEnds: ends, statuses: statuses, resultKeys: resultKeys, thumbnailKeys: thumbnailKeys,
            totalCount: totalCount, hasMore: hasMore, nextCursor: nextCursor, sections: sections
        )
    }

    /// How many items the page holds.
    public var count: Int { headEnds.count }

    /// Item `index`'s head, as UTF-8 byte offsets into `headText`.
    public func headRange(_ index: Int) -> Range<Int> {
        (index == 0 ? 0 : headEnds[index - 1])..<headEnds[index]
    }

    /// Whether the lists line up and the heads' ends rise within the text: a page that does not
    /// is refused rather than read past its end (history never sends one).
    public var isWellFormed: Bool {
        let count = headEnds.count
        guard statuses.count == count, resultKeys.count == count, thumbnailKeys.count == count else { return false }
        var previous = 0
        for end in headEnds {
            guard end >= previous else { return false }
            previous = end
        }
        return previous <= headText.utf8.count
    }

    /// `page` with its items written.
    public init(_ page: HistoryPage) {
        var heads = Heads(capacity: page.items.count)
        var statuses: [HistoryStatus] = [], results: [String] = [], thumbnails: [String] = []
        statuses.reserveCapacity(page.items.count)
        results.reserveCapacity(page.items.count)
        thumbnails.reserveCapacity(page.items.count)
        // Where each item is, for the month sections alone.
        var index: [String: Int] = [:]
        for item in page.items {
            if page.sections != nil { index[item.jobId] = heads.count }
            heads.write { item.writeHead(&$0) }
            statuses.append(item.appStatus)
            results.append(item.linkedKeys.result ?? "")
            thumbnails.append(item.linkedKeys.thumbnail ?? "")
        }
        let (text, ends) = heads.finish()
        self.init(
            headText: text, headEnds: ends, statuses: statuses, resultKeys: results, thumbnailKeys: thumbnails, totalCount: page.totalCount,
            hasMore: page.hasMore, nextCursor: page.nextCursor,
            sections: page.sections?.map { section in
                Section(month: section.month, title: section.title, items: section.items.compactMap { index[$0.jobId] })
            }
        )
    }

    /// The heads of a page written one after another into one buffer.
    public struct Heads: Sendable {
        private var out: JSONBytes
        private var ends: [Int] = []

        public init(capacity: Int) {
            out = JSONBytes(capacity: max(1, capacity) * 512)
            ends.reserveCapacity(capacity)
        }

        /// How many heads are written.
        public var count: Int { ends.count }

        /// Writes the next head.
        public mutating func write(_ head: (inout JSONBytes) -> Void) {
            head(&out)
            ends.append(out.bytes.count)
        }

        /// The text and each head's end. Invalid UTF-8 (text a damaged database gave up) is mended
        /// head by head, as a string of each head mends it, with the ends moved to match.
        public func finish() -> (text: String, ends: [Int]) {
            if let text = String(validating: out.bytes, as: UTF8.self) { return (text, ends) }
            var text = "", mended: [Int] = [], start = 0
            mended.reserveCapacity(ends.count)
            for end in ends {
                text += String(decoding: out.bytes[start..<end], as: UTF8.self)
                mended.append(text.utf8.count)
                start = end
            }
            return (text, mended)
        }
    }
}
