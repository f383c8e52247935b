import Foundation
@testable import GatewayApp
import Messages
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

    /// A job without an `Idempotency-Key` gets one; with a key, the id is still derived from it.
    @Test func jobIdsWithoutAKeyAreTimeOrdered() throws {
        let id = try JobCreator.jobId(user: "device:u", idempotencyKey: nil)
        #expect(try Self.bytes(id)[6] >> 4 == 7)
        let keyed = try JobCreator.jobId(user: "device:u", idempotencyKey: "k")
        #expect(try Self.bytes(keyed)[6] >> 4 == 5)
        #expect(keyed == (try JobCreator.jobId(user: "device:u", idempotencyKey: "k")))
    }
}
