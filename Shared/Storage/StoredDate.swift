#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// A date as GRDB stores it (`yyyy-MM-dd HH:mm:ss.SSS`, UTC), written without a `DateFormatter`:
/// binding a `Date` formats it through ICU, a few microseconds on every write of a hot path.
/// Same text (milliseconds rounded to the nearest, halves up, as its formatter does), same ordering, read
/// back by GRDB as any stored `Date`.
public enum StoredDate {
    public static func text(_ date: Date) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000 + 0.5).rounded(.down))
        var seconds = time_t(milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000)
        let millis = Int(milliseconds - Int64(seconds) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(23)
        func digits(_ value: Int, _ count: Int) {
            var divisor = 1
            for _ in 1..<count { divisor *= 10 }
            var value = value
            while divisor > 0 {
                bytes.append(UInt8(48 + value / divisor % 10))
                value %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        bytes.append(45)  // -
        digits(Int(parts.tm_mon) + 1, 2)
        bytes.append(45)
        digits(Int(parts.tm_mday), 2)
        bytes.append(32)  // space
        digits(Int(parts.tm_hour), 2)
        bytes.append(58)  // :
        digits(Int(parts.tm_min), 2)
        bytes.append(58)
        digits(Int(parts.tm_sec), 2)
        bytes.append(46)  // .
        digits(millis, 3)
        return String(decoding: bytes, as: UTF8.self)
    }
}
