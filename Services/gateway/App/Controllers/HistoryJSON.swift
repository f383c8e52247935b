#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Hummingbird
import Messages

/// The History routes' bodies (a page, one item, the changes feed), written straight into the
/// response's bytes in one pass over the items history sent: no `JSONEncoder`, dates written
/// without a formatter, and each blob's download URL signed once per response however often its
/// item appears (a page grouped by month lists each item twice).
///
/// The shape is the app's `HistoryItem` and page, as `JSONEncoder` with sorted keys wrote them
/// before (`HistoryJSONTests` holds the two equal): keys in sorted order, absent values left out,
/// dates in ISO 8601 UTC to the second.
struct HistoryJSON {
    private let links: DownloadLinks
    private let now: Date
    private var urls: [String: String] = [:]
    private(set) var bytes: [UInt8] = []

    init(links: DownloadLinks, now: Date = Date(), capacity: Int = 1024) {
        self.links = links
        self.now = now
        bytes.reserveCapacity(capacity)
    }

    /// A 200 (or `status`) answer of `body`'s bytes.
    static func response(_ status: HTTPResponse.Status = .ok, links: DownloadLinks, capacity: Int = 1024, _ body: (inout HistoryJSON) -> Void) -> Response {
        var writer = HistoryJSON(links: links, capacity: capacity)
        body(&writer)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: writer.bytes)))
    }

    // MARK: Bodies

    /// `{hasMore, items, nextCursor?, sections?, totalCount}`.
    mutating func page(_ page: HistoryPage) {
        raw("{\"hasMore\":")
        bool(page.hasMore)
        raw(",\"items\":")
        items(page.items)
        if let cursor = page.nextCursor {
            raw(",\"nextCursor\":")
            string(cursor)
        }
        if let sections = page.sections {
            raw(",\"sections\":[")
            for (index, section) in sections.enumerated() {
                if index > 0 { raw(",") }
                raw("{\"items\":")
                items(section.items)
                raw(",\"month\":")
                string(section.month)
                raw(",\"title\":")
                string(section.title)
                raw("}")
            }
            raw("]")
        }
        raw(",\"totalCount\":")
        integer(page.totalCount)
        raw("}")
    }

    /// `{changes: [{id?, item?, op}], hasMore, nextToken}`.
    mutating func changes(_ changes: HistoryChanges) {
        raw("{\"changes\":[")
        for (index, change) in changes.changes.enumerated() {
            if index > 0 { raw(",") }
            raw("{")
            if let id = change.id ?? change.item?.jobId {
                raw("\"id\":")
                string(id)
                raw(",")
            }
            if let item = change.item {
                raw("\"item\":")
                self.item(item)
                raw(",")
            }
            raw("\"op\":")
            string(change.op.rawValue)
            raw("}")
        }
        raw("],\"hasMore\":")
        bool(changes.hasMore)
        raw(",\"nextToken\":")
        string(changes.nextToken)
        raw("}")
    }

    /// One item as the app's `HistoryItem` decodes it: `status` one of the app's four values, the
    /// URLs only once it completed, `error` only when it failed, `progress` only while it runs,
    /// `credits` what it used (0 once failed or cancelled: they were given back).
    mutating func item(_ item: HistoryItem) {
        let status = HistoryStatus(item.status)
        let completed = item.status == .completed
        raw("{\"createdAt\":")
        date(item.createdAt)
        raw(",\"credits\":")
        integer(item.cost)
        raw(",\"effectId\":")
        string(item.effectId)
        raw(",\"effectTitle\":")
        string(item.effectTitle)
        if item.status == .failed, let error = item.lastError {
            raw(",\"error\":")
            string(error)
        }
        raw(",\"id\":")
        string(item.jobId)
        raw(",\"originalImageKey\":")
        string(item.originalImageKey)
        raw(",\"parameters\":{")
        for (index, name) in item.parameters.keys.sorted().enumerated() {
            if index > 0 { raw(",") }
            string(name)
            raw(":")
            number(item.parameters[name]!)
        }
        raw("}")
        if status == .processing {
            raw(",\"progress\":")
            number(item.progress)
        }
        if let prompt = item.prompt {
            raw(",\"prompt\":")
            string(prompt)
        }
        if completed, let url = url(item.resultKey) {
            raw(",\"resultUrl\":")
            string(url)
        }
        raw(",\"status\":")
        string(status.rawValue)
        if completed, let url = url(item.thumbnailKey) {
            raw(",\"thumbnailUrl\":")
            string(url)
        }
        raw("}")
    }

    private mutating func items(_ items: [HistoryItem]) {
        raw("[")
        for (index, item) in items.enumerated() {
            if index > 0 { raw(",") }
            self.item(item)
        }
        raw("]")
    }

    /// `key`'s download URL, signed once per response.
    private mutating func url(_ key: String?) -> String? {
        guard let key else { return nil }
        if let url = urls[key] { return url }
        let url = links.url(key, now: now)
        urls[key] = url
        return url
    }

    // MARK: Values

    private mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    private mutating func bool(_ value: Bool) {
        value ? raw("true") : raw("false")
    }

    private mutating func integer(_ value: Int) {
        bytes.append(contentsOf: String(value).utf8)
    }

    /// A finite number as Swift prints it (`0.5`, `1e-07`; a whole one without `.0`); anything
    /// else, which no stored value is, as 0.
    private mutating func number(_ value: Double) {
        guard value.isFinite else { return raw("0") }
        if value == value.rounded(), abs(value) < 1e15 {
            integer(Int(value))
        } else {
            bytes.append(contentsOf: value.description.utf8)
        }
    }

    /// A JSON string: `"` and `\` escaped, control characters as `\n`, `\t`… or `\u00XX`; the
    /// rest, slashes and non-ASCII included, as it is.
    private mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        // Most text needs no escape: copied whole.
        if !value.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
            bytes.append(contentsOf: value.utf8)
            bytes.append(UInt8(ascii: "\""))
            return
        }
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): raw("\\\"")
            case UInt8(ascii: "\\"): raw("\\\\")
            case 0x0A: raw("\\n")
            case 0x0D: raw("\\r")
            case 0x09: raw("\\t")
            case 0x08: raw("\\b")
            case 0x0C: raw("\\f")
            case 0..<0x20:
                raw("\\u00")
                bytes.append(Self.hex[Int(byte >> 4)])
                bytes.append(Self.hex[Int(byte & 0x0F)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private static let hex = Array("0123456789abcdef".utf8)

    /// `2026-11-25T17:53:09Z`: UTC, to the second (rounded down), as `.iso8601` writes it.
    private mutating func date(_ date: Date) {
        var seconds = time_t((date.timeIntervalSince1970).rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        bytes.append(UInt8(ascii: "\""))
        digits(Int(parts.tm_year) + 1900, 4)
        bytes.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        bytes.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        bytes.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        bytes.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        bytes.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        raw("Z\"")
    }

    private mutating func digits(_ value: Int, _ count: Int) {
        var divisor = 1
        for _ in 1..<count { divisor *= 10 }
        var value = value
        while divisor > 0 {
            bytes.append(UInt8(48 + value / divisor % 10))
            value %= divisor
            divisor /= 10
        }
    }
}
