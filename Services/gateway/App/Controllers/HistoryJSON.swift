import Foundation
import Hummingbird
import Messages

/// The History routes' bodies (a page, one item, the changes feed), written straight into the
/// response's bytes: a page's items arrive from history already written up to their URLs
/// (`history.page`), and the gateway only adds what it alone can, each blob's download URL (signed
/// once a minute however often it appears, `DownloadLinks`; a page grouped by month lists each
/// item twice). No `JSONEncoder`, no date formatter.
///
/// The shape is the app's `HistoryItem` and page, as `JSONEncoder` with sorted keys wrote them
/// before (`HistoryJSONTests`): keys in sorted order, absent values left out, dates in ISO 8601
/// UTC to the second.
struct HistoryJSON {
    private let links: DownloadLinks
    private let now: Date
    private var out: JSONBytes

    init(links: DownloadLinks, now: Date = Date(), capacity: Int = 1024) {
        self.links = links
        self.now = now
        out = JSONBytes(capacity: capacity)
    }

    var bytes: [UInt8] { out.bytes }

    /// A 200 (or `status`) answer of `body`'s bytes.
    static func response(
        _ status: HTTPResponse.Status = .ok, links: DownloadLinks, capacity: Int = 1024, _ body: (inout HistoryJSON) throws -> Void
    ) rethrows -> Response {
        var writer = HistoryJSON(links: links, capacity: capacity)
        try body(&writer)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: writer.bytes)))
    }

    // MARK: Bodies

    /// `{hasMore, items, nextCursor?, sections?, totalCount}`. Throws for a page whose lists do
    /// not line up (history never sends one).
    mutating func page(_ page: RenderedHistoryPage) throws {
        guard page.isWellFormed else {
            throw BusError(.internal, "history answered a page whose item lists differ in length or whose heads overrun their text")
        }
        var text = page.headText
        text.withUTF8 { heads in
            out.raw("{\"hasMore\":")
            out.bool(page.hasMore)
            out.raw(",\"items\":")
            items(page, heads, 0..<page.count)
            if let cursor = page.nextCursor {
                out.raw(",\"nextCursor\":")
                out.string(cursor)
            }
            if let sections = page.sections {
                out.raw(",\"sections\":[")
                for (index, section) in sections.enumerated() {
                    if index > 0 { out.raw(",") }
                    out.raw("{\"items\":")
                    items(page, heads, section.items.filter { (0..<page.count).contains($0) })
                    out.raw(",\"month\":")
                    out.string(section.month)
                    out.raw(",\"title\":")
                    out.string(section.title)
                    out.raw("}")
                }
                out.raw("]")
            }
        }
        out.raw(",\"totalCount\":")
        out.integer(page.totalCount)
        out.raw("}")
    }

    /// `{changes: [{id?, item?, op}], hasMore, nextToken}`.
    mutating func changes(_ changes: HistoryChanges) {
        out.raw("{\"changes\":[")
        for (index, change) in changes.changes.enumerated() {
            if index > 0 { out.raw(",") }
            out.raw("{")
            if let id = change.id ?? change.item?.jobId {
                out.raw("\"id\":")
                out.string(id)
                out.raw(",")
            }
            if let item = change.item {
                out.raw("\"item\":")
                self.item(item)
                out.raw(",")
            }
            out.raw("\"op\":")
            out.string(change.op.rawValue)
            out.raw("}")
        }
        out.raw("],\"hasMore\":")
        out.bool(changes.hasMore)
        out.raw(",\"nextToken\":")
        out.string(changes.nextToken)
        out.raw("}")
    }

    /// One item as the app's `HistoryItem` decodes it (the URLs only once it completed).
    mutating func item(_ item: HistoryItem) {
        item.writeHead(&out)
        let keys = item.linkedKeys
        HistoryItem.writeTail(&out, status: item.appStatus, resultURL: url(keys.result), thumbnailURL: url(keys.thumbnail))
    }

    /// The items at `indexes`, their heads cut from `heads` (`page.headText`'s bytes).
    private mutating func items(_ page: RenderedHistoryPage, _ heads: UnsafeBufferPointer<UInt8>, _ indexes: some Sequence<Int>) {
        out.raw("[")
        var first = true
        for index in indexes {
            if !first { out.raw(",") }
            first = false
            out.json(utf8: UnsafeBufferPointer(rebasing: heads[page.headRange(index)]))
            HistoryItem.writeTail(
                &out, status: page.statuses[index], resultURL: url(page.resultKeys[index]), thumbnailURL: url(page.thumbnailKeys[index])
            )
        }
        out.raw("]")
    }

    /// `key`'s download URL (the same all minute, `DownloadLinks`); none for no key.
    private func url(_ key: String?) -> String? {
        guard let key, !key.isEmpty else { return nil }
        return links.url(key, now: now)
    }
}
