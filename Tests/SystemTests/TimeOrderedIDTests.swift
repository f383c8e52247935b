import Foundation
@testable import GatewayApp
@testable import Messages
import Testing

/// New job ids are version 7 UUIDs (RFC 9562 §5.7): the layout checked bit by bit, the time read
/// back, and ids of later milliseconds sorting after earlier ones as text (what the stores'
/// B-trees compare).
@Suite("Time-ordered ids", .timeLimit(.minutes(5)))
struct TimeOrderedIDTests {
    /// The 16 bytes of a lowercase UUID's text.
    static func bytes(_ id: String) throws -> [UInt8] {
        let uuid = try #require(UUID(uuidString: id)).uuid
        return withUnsafeBytes(of: uuid) { Array($0) }
    }

    @Test func theLayoutIsVersion7WithTheTimeInItsFirst48Bits() throws {
        let now = Date(timeIntervalSince1970: 1_795_000_000.123)
        for _ in 0..<200 {
            let id = TimeOrderedID.make(now: now)
            #expect(id == id.lowercased() && id.count == 36)
            let bytes = try Self.bytes(id)
            #expect(bytes[6] >> 4 == 7, "version nibble")
            #expect(bytes[8] >> 6 == 0b10, "RFC 9562 variant")
            let milliseconds = bytes[0..<6].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            #expect(milliseconds == 1_795_000_000_123)
        }
    }

    @Test func laterMillisecondsSortAfterAndIdsDoNotRepeat() {
        var previous = ""
        var seen = Set<String>()
        for step in 0..<2_000 {
            let id = TimeOrderedID.make(now: Date(timeIntervalSince1970: 1_795_000_000 + Double(step) / 1000))
            #expect(id > previous)
            previous = id
            seen.insert(id)
        }
        let sameMillisecond = (0..<2_000).map { _ in TimeOrderedID.make(now: Date(timeIntervalSince1970: 1_795_000_000)) }
        #expect(seen.count == 2_000 && Set(sameMillisecond).count == 2_000)
    }

    /// The text is exactly Foundation's UUID text, lowercased, for any bits (the digits are
    /// written directly).
    @Test func theTextIsFoundationsUUIDTextLowercased() throws {
        var random = SystemRandomNumberGenerator()
        for _ in 0..<1_000 {
            let first = random.next() as UInt64, second = random.next() as UInt64
            var bytes = [UInt8](repeating: 0, count: 16)
            for index in 0..<8 {
                let shift = UInt64(56 - 8 * index)
                bytes[index] = UInt8(truncatingIfNeeded: first >> shift)
                bytes[8 + index] = UInt8(truncatingIfNeeded: second >> shift)
            }
            let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                                   bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
            #expect(TimeOrderedID.text(first, second) == uuid.uuidString.lowercased())
        }
        #expect(TimeOrderedID.text(0, .max) == "00000000-0000-0000-ffff-ffffffffffff")
    }

    /// A job without an `Idempotency-Key` gets one; with a key, the id is still derived from it.
    @Test func jobIdsWithoutAKeyAreTimeOrdered() throws {
        let id = try JobCreator.jobId(user: "device:u", idempotencyKey: nil)
        #expect(try Self.bytes(id)[6] >> 4 == 7)
        let keyed = try JobCreator.jobId(user: "device:u", idempotencyKey: "k")
        #expect(try Self.bytes(keyed)[6] >> 4 == 5)
        #expect(keyed == (try JobCreator.jobId(user: "device:u", idempotencyKey: "k")))
    }
}
