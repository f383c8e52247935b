import Foundation

/// New ids as time-ordered UUIDs (version 7, RFC 9562 §5.7): 48 bits of Unix milliseconds, then
/// 74 random bits. A job id is the key of a B-tree in every store (jobs' `job`, quota's charges,
/// history's items by job), and a random id (version 4) lands each new one on a random page, so
/// each commit rewrote a page per job in each of them; ids made in the same second land on the
/// same last pages instead. The text is an ordinary lowercase UUID, as clients already parse.
public enum TimeOrderedID {
    /// A version 7 UUID for `now`, lowercase.
    public static func make(now: Date = Date()) -> String {
        var random = SystemRandomNumberGenerator()
        let milliseconds = UInt64(max(0, now.timeIntervalSince1970 * 1000))
        let high = random.next() as UInt64, low = random.next() as UInt64
        // 48 bits of time, the version nibble 7, then 12 random bits.
        let first = (milliseconds << 16) | 0x7000 | (high & 0x0FFF)
        // The variant bits 10, then 62 random bits.
        let second = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
        var bytes = [UInt8](repeating: 0, count: 16)
        for index in 0..<8 {
            bytes[index] = UInt8(truncatingIfNeeded: first >> (56 - 8 * index))
            bytes[8 + index] = UInt8(truncatingIfNeeded: second >> (56 - 8 * index))
        }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15])).uuidString.lowercased()
    }
}
