#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A UTC date and time written as digits, without a formatter: what `JSONBytes.date` (ISO 8601)
/// and `StoredDate` (GRDB's text) share.
public enum UTCText {
    /// Appends `yyyy-MM-dd` + `separator` + `HH:mm:ss` for `seconds` since 1970.
    public static func appendDateTime(_ seconds: Int64, separator: UInt8, to bytes: inout [UInt8]) {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        appendDigits(Int(parts.tm_year) + 1900, 4, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        appendDigits(Int(parts.tm_mon) + 1, 2, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        appendDigits(Int(parts.tm_mday), 2, to: &bytes)
        bytes.append(separator)
        appendDigits(Int(parts.tm_hour), 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        appendDigits(Int(parts.tm_min), 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        appendDigits(Int(parts.tm_sec), 2, to: &bytes)
    }

    /// Appends the last `count` decimal digits of `value`, zero-padded.
    public static func appendDigits(_ value: Int, _ count: Int, to bytes: inout [UInt8]) {
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
