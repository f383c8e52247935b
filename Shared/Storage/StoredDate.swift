import Foundation
import Messages

/// A date as GRDB stores it (`yyyy-MM-dd HH:mm:ss.SSS`, UTC), written without a `DateFormatter`:
/// binding a `Date` formats it through ICU, a few microseconds on every write of a hot path.
/// Same text (milliseconds rounded to the nearest, halves up, as its formatter does), same ordering, read
/// back by GRDB as any stored `Date`.
public enum StoredDate {
    public static func text(_ date: Date) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000 + 0.5).rounded(.down))
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        var bytes: [UInt8] = []
        bytes.reserveCapacity(23)
        UTCText.appendDateTime(seconds, separator: UInt8(ascii: " "), to: &bytes)
        bytes.append(UInt8(ascii: "."))
        UTCText.appendDigits(Int(milliseconds - seconds * 1000), 3, to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }
}
