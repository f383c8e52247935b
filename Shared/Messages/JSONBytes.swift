import Foundation

/// JSON written straight into bytes, value by value, for the answers written in one pass (the
/// History screen's pages): no encoder, no tree, dates without a formatter. The caller writes the
/// punctuation (`raw`) and keeps keys in the order it wants.
public struct JSONBytes: Sendable {
    public private(set) var bytes: [UInt8] = []

    public init(capacity: Int = 1024) {
        bytes.reserveCapacity(capacity)
    }

    /// Appends `text` as it is (punctuation, keys, or JSON written elsewhere).
    public mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    /// Appends `utf8`, which must already be JSON, as it is.
    public mutating func json(utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(contentsOf: utf8)
    }

    public mutating func bool(_ value: Bool) {
        value ? raw("true") : raw("false")
    }

    public mutating func integer(_ value: Int) {
        bytes.append(contentsOf: String(value).utf8)
    }

    /// A finite number as Swift prints it (`0.5`, `1e-07`; a whole one without `.0`); anything
    /// else, which no stored value is, as 0.
    public mutating func number(_ value: Double) {
        guard value.isFinite else { return raw("0") }
        if value == value.rounded(), abs(value) < 1e15 {
            integer(Int(value))
        } else {
            bytes.append(contentsOf: value.description.utf8)
        }
    }

    /// A JSON string: `"` and `\` escaped, control characters as `\n`, `\t`… or `\u00XX`; the
    /// rest, slashes and non-ASCII included, as it is.
    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { string(utf8: $0) }
    }

    /// `string` of text given as its UTF-8 bytes (a database column's, say), which the caller
    /// knows to be UTF-8.
    public mutating func string(utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(UInt8(ascii: "\""))
        // Most text needs no escape: the runs between escapes are found eight bytes at a time
        // and copied whole (looking at each byte was 2% of the machine in the gateway, writing
        // the URLs of deep history pages, and 1% in history writing their items; perf).
        var start = 0
        var next = Self.firstEscape(in: utf8, from: 0)
        while next < utf8.count {
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start..<next]))
            escape(utf8[next])
            start = next + 1
            next = Self.firstEscape(in: utf8, from: start)
        }
        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start...]))
        bytes.append(UInt8(ascii: "\""))
    }

    private mutating func escape(_ byte: UInt8) {
        switch byte {
        case UInt8(ascii: "\""): raw("\\\"")
        case UInt8(ascii: "\\"): raw("\\\\")
        case 0x0A: raw("\\n")
        case 0x0D: raw("\\r")
        case 0x09: raw("\\t")
        case 0x08: raw("\\b")
        case 0x0C: raw("\\f")
        default:
            raw("\\u00")
            bytes.append(Self.hex[Int(byte >> 4)])
            bytes.append(Self.hex[Int(byte & 0x0F)])
        }
    }

    @inline(__always) private static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
    }

    /// The index of the first byte at or after `start` that `string` escapes, or the count.
    /// Whole words first: a word holds such a byte when one of its bytes is below 0x20, or is
    /// zero once xored with `"` or `\` (the "has a byte less than" tests of Bit Twiddling
    /// Hacks, exact for whether any byte matches); then the word's bytes one by one.
    static func firstEscape(in utf8: UnsafeBufferPointer<UInt8>, from start: Int) -> Int {
        var index = start
        if let base = utf8.baseAddress {
            let ones: UInt64 = 0x0101_0101_0101_0101, highs: UInt64 = 0x8080_8080_8080_8080
            @inline(__always) func hasByteBelow(_ word: UInt64, _ limit: UInt64) -> Bool {
                (word &- ones &* limit) & ~word & highs != 0
            }
            while index + 8 <= utf8.count {
                let word = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                if hasByteBelow(word, 0x20) || hasByteBelow(word ^ (ones &* 0x22), 1) || hasByteBelow(word ^ (ones &* 0x5C), 1) { break }
                index += 8
            }
        }
        while index < utf8.count, !needsEscape(utf8[index]) { index += 1 }
        return index
    }

    private static let hex = Array("0123456789abcdef".utf8)

    /// `{"a":1,"b":0.5}`: an object of numbers, its keys in sorted order (as `JSONEncoder`'s
    /// `.sortedKeys` wrote them), each number as `number` writes it.
    public mutating func numbers(_ values: [String: Double]) {
        raw("{")
        for (index, name) in values.keys.sorted().enumerated() {
            if index > 0 { raw(",") }
            string(name)
            raw(":")
            number(values[name]!)
        }
        raw("}")
    }

    /// `2026-11-25T17:53:09Z`: UTC, to the second (rounded down), as `JSONEncoder`'s `.iso8601`
    /// writes it.
    public mutating func date(_ date: Date) {
        bytes.append(UInt8(ascii: "\""))
        UTCText.appendDateTime(Int64(date.timeIntervalSince1970.rounded(.down)), separator: UInt8(ascii: "T"), to: &bytes)
        raw("Z\"")
    }
}
