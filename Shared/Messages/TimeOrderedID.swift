import Foundation

/// New ids as time-ordered UUIDs (version 7, RFC 9562 §5.7): 48 bits of Unix milliseconds, then
/// 74 random bits. A job id is the key of a B-tree in every store (jobs' `job`, quota's charges,
/// history's items by job), and a random id (version 4) lands each new one on a random page, so
/// each commit rewrote a page per job in each of them; ids made in the same second land on the
/// same last pages instead. The text is an ordinary lowercase UUID, as clients already parse.
public enum TimeOrderedID {
    /// A version 7 UUID for `now`, lowercase.
    public static func make(now: Date = Date()) -> String {
        let milliseconds = UInt64(max(0, now.timeIntervalSince1970 * 1000))
        var random = SystemRandomNumberGenerator()
        let high = random.next() as UInt64, low = random.next() as UInt64
        // 48 bits of time, the version nibble 7, then 12 random bits.
        let first = (milliseconds << 16) | 0x7000 | (high & 0x0FFF)
        // The variant bits 10, then 62 random bits.
        let second = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
        return text(first, second)
    }

    /// The UUID text of the 128 bits `first` then `second`, lowercase: 8-4-4-4-12 hex digits.
    static func text(_ first: UInt64, _ second: UInt64) -> String {
        String(unsafeUninitializedCapacity: 36) { buffer in
            let digits: StaticString = "0123456789abcdef"
            var index = 0
            func put(_ word: UInt64) {
                for shift in stride(from: 60, through: 0, by: -4) {
                    if index == 8 || index == 13 || index == 18 || index == 23 {
                        buffer[index] = UInt8(ascii: "-")
                        index += 1
                    }
                    buffer[index] = digits.utf8Start[Int(truncatingIfNeeded: (word >> UInt64(shift)) & 0xF)]
                    index += 1
                }
            }
            put(first)
            put(second)
            return index
        }
    }
}
