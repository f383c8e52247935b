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
    /// Each item's `HistoryItem.writeHead` text, newest first.
    public var heads: [String]
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
        heads: [String], statuses: [HistoryStatus], resultKeys: [String], thumbnailKeys: [String], totalCount: Int, hasMore: Bool,
        nextCursor: String?, sections: [Section]?
    ) {
        self.heads = heads
        self.statuses = statuses
        self.resultKeys = resultKeys
        self.thumbnailKeys = thumbnailKeys
        self.totalCount = totalCount
        self.hasMore = hasMore
        self.nextCursor = nextCursor
        self.sections = sections
    }

    /// `page` with its items written.
    public init(_ page: HistoryPage) {
        var heads: [String] = [], statuses: [HistoryStatus] = [], results: [String] = [], thumbnails: [String] = []
        heads.reserveCapacity(page.items.count)
        statuses.reserveCapacity(page.items.count)
        results.reserveCapacity(page.items.count)
        thumbnails.reserveCapacity(page.items.count)
        // Where each item is, for the month sections alone.
        var index: [String: Int] = [:]
        for item in page.items {
            var out = JSONBytes(capacity: 512)
            item.writeHead(&out)
            if page.sections != nil { index[item.jobId] = heads.count }
            heads.append(String(decoding: out.bytes, as: UTF8.self))
            statuses.append(item.appStatus)
            results.append(item.linkedKeys.result ?? "")
            thumbnails.append(item.linkedKeys.thumbnail ?? "")
        }
        self.heads = heads
        self.statuses = statuses
        resultKeys = results
        thumbnailKeys = thumbnails
        totalCount = page.totalCount
        hasMore = page.hasMore
        nextCursor = page.nextCursor
        sections = page.sections?.map { section in
            Section(month: section.month, title: section.title, items: section.items.compactMap { index[$0.jobId] })
        }
    }
}
