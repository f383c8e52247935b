import Foundation

/// JSON written straight into bytes, value by value, for the answers written in one pass (the
/// History screen's pages): no encoder, no tree, dates without a formatter. The caller writes the
/// punctuation (`raw`) and keeps keys in the order it wants.
public struct JSONBytes {
    public private(set) var bytes: [UInt8] = []

    public init(capacity: Int = 1024) {
        bytes.reserveCapacity(capacity)
    }

    /// Appends `text` as it is (punctuation, keys, or JSON written elsewhere).
    public mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    /// Appends `text`, which must already be JSON, as it is.
    public mutating func json(_ text: String) {
        bytes.append(contentsOf: text.utf8)
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
        // Most text needs no escape: looked through and copied whole (the generic
        // `utf8.contains` took 4% of the machine writing history pages).
        var clean = true
        for byte in utf8 where byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
            clean = false
            break
        }
        if clean {
            bytes.append(contentsOf: utf8)
            bytes.append(UInt8(ascii: "\""))
            return
        }
        for byte in utf8 {
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
