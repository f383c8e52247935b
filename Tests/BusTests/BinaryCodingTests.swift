import Foundation
import Messages
import Testing

@testable import BinaryWire
@testable import Bus

/// Every shape `Codable` produces: scalars at their limits, optionals both ways, nesting,
/// dictionaries, enums with associated values, dates and bytes.
private struct Everything: Codable, Equatable {
    enum Mood: String, Codable { case calm, busy }
    struct Inner: Codable, Equatable {
        var name: String
        var values: [Double]
    }

    var int = Int.min
    var int8 = Int8.min
    var int16 = Int16.max
    var int32 = Int32.min
    var int64 = Int64.max
    var uint = UInt.max
    var uint8 = UInt8.max
    var uint16 = UInt16.max
    var uint32 = UInt32.max
    var uint64 = UInt64.max
    var negative = -1
    var zero = 0
    var double = -0.1
    var infinity = Double.infinity
    var float: Float = 3.25
    var flag = true
    var other = false
    var text = "héllo, 世界 🌍"
    var empty = ""
    var absent: String?
    var present: Int? = 7
    var mood = Mood.busy
    var inner = Inner(name: "x", values: [1, 2.5, -3])
    var inners = [Inner(name: "a", values: []), Inner(name: "b", values: [0])]
    var byName: [String: Int] = ["one": 1, "two": 2]
    var byNumber: [Int: String] = [1: "one", -2: "minus two"]
    var nested: [[Int?]] = [[1, nil, 3], [], [nil]]
    var date = Date(timeIntervalSince1970: 1_795_000_000.25)
    var data = Data([0, 1, 2, 255])
    var message = WorkerMessage.failed(JobAttempt(jobId: "j", attempt: 2), error: "boom", retryable: true)
    var messages: [DispatcherMessage] = [.heartbeat, .reconnect, .cancel(JobAttempt(jobId: "k", attempt: 1))]
}

private struct Version1: Codable, Equatable {
    var id: String
    var count: Int
    var note: String?
}

private struct Version2: Codable, Equatable {
    var id: String
    var added: [String: [Int]]
    var count: Int
    var extra: Everything.Inner
}

/// `bytes` with one to four of them replaced at random.
func corrupted(_ bytes: [UInt8], using generator: inout some RandomNumberGenerator) -> [UInt8] {
    var bytes = bytes
    for _ in 0..<Int.random(in: 1...4, using: &generator) {
        bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
    }
    return bytes
}

private struct Recursive: Codable {
    var children: [Recursive]
}

@Suite("Binary coding", .timeLimit(.minutes(5)))
struct BinaryCodingTests {
    @Test func everyShapeRoundTrips() throws {
        let value = Everything()
        #expect(try BinaryCoding.decode(Everything.self, from: BinaryCoding.encode(value)) == value)
        var other = Everything()
        other.absent = "now here"
        other.present = nil
        other.double = .nan
        let decoded = try BinaryCoding.decode(Everything.self, from: BinaryCoding.encode(other))
        #expect(decoded.absent == "now here" && decoded.present == nil && decoded.double.isNaN)
    }

    @Test func everyBusMessageRoundTrips() throws {
        let messages: [WorkerMessage] = [
            .ready(WorkerReady(workerId: "w-1", capacity: 2, effects: ["copy", "blur"])),
            .heartbeat(running: [JobAttempt(jobId: "a", attempt: 1), JobAttempt(jobId: "b", attempt: 3)]),
            .heartbeat(running: []),
            .progress(JobAttempt(jobId: "a", attempt: 1), fraction: 0.5),
            .done(JobAttempt(jobId: "a", attempt: 1), JobOutput(resultKey: "r", thumbnailKey: "t")),
            .cancelled(JobAttempt(jobId: "a", attempt: 1)),
            .metrics("# TYPE x counter\nx 1\n"),
        ]
        for message in messages {
            #expect(try BinaryCoding.decode(WorkerMessage.self, from: BinaryCoding.encode(message)) == message)
        }
        let error = BusError(.overloaded, "too many")
        let decoded = try BinaryCoding.decode(BusError.self, from: BinaryCoding.encode(error))
        #expect(decoded.code == .overloaded && decoded.message == "too many" && decoded.retryable)
    }

    @Test func aDateIsWrittenAsItsOwnCodableWritesIt() throws {
        // Date encodes itself as seconds since 2001 in a single value: the binary form's direct
        // path for dates must write and read exactly that, or processes of two versions disagree.
        let date = Date(timeIntervalSince1970: 1_795_000_000.25)
        #expect(try BinaryCoding.encode(date) == BinaryCoding.encode(date.timeIntervalSinceReferenceDate))
        #expect(try BinaryCoding.decode(Date.self, from: BinaryCoding.encode(date.timeIntervalSinceReferenceDate)) == date)
        struct Dated: Codable, Equatable { var at: Date; var maybe: Date? }
        let dated = Dated(at: date, maybe: date.addingTimeInterval(1))
        struct Seconds: Codable { var at: Double; var maybe: Double? }
        let seconds = Seconds(at: date.timeIntervalSinceReferenceDate, maybe: date.addingTimeInterval(1).timeIntervalSinceReferenceDate)
        #expect(try BinaryCoding.encode(dated) == BinaryCoding.encode(seconds))
        #expect(try BinaryCoding.decode(Dated.self, from: BinaryCoding.encode(seconds)) == dated)
        // A date written as an integer (a JSON-minded writer) still reads
        #expect(try BinaryCoding.decode(Date.self, from: BinaryCoding.encode(Int(600))) == Date(timeIntervalSinceReferenceDate: 600))
    }

    @Test func topLevelScalarsAndCollectionsRoundTrip() throws {
        #expect(try BinaryCoding.decode(Int.self, from: BinaryCoding.encode(42)) == 42)
        #expect(try BinaryCoding.decode(String.self, from: BinaryCoding.encode("s")) == "s")
        #expect(try BinaryCoding.decode([String].self, from: BinaryCoding.encode(["a", "b"])) == ["a", "b"])
        #expect(try BinaryCoding.decode(String?.self, from: BinaryCoding.encode(String?.none)) == nil)
    }

    @Test func fieldsAddedOrDroppedDecodeAsWithJSON() throws {
        // A newer sender's extra fields are skipped; an older sender's missing optional is nil.
        let newer = Version2(id: "x", added: ["k": [1, 2]], count: 3, extra: .init(name: "n", values: [1]))
        #expect(try BinaryCoding.decode(Version1.self, from: BinaryCoding.encode(newer)) == Version1(id: "x", count: 3, note: nil))
        // A missing required field is named.
        do {
            _ = try BinaryCoding.decode(Version2.self, from: BinaryCoding.encode(Version1(id: "x", count: 1)))
            Issue.record("decoded a value with missing fields")
        } catch DecodingError.keyNotFound(let key, _) {
            #expect(key.stringValue == "added")
        }
    }

    @Test func wrongTypesAndOverflowsAreTypedErrors() throws {
        let bytes = try BinaryCoding.encode(Version1(id: "x", count: 300))
        #expect(throws: DecodingError.self) { try BinaryCoding.decode([String: String].self, from: bytes) }
        struct Small: Codable { var count: Int8 }
        #expect(throws: DecodingError.self) { try BinaryCoding.decode(Small.self, from: bytes) }
        struct Unsigned: Codable { var value: UInt }
        #expect(throws: DecodingError.self) {
            try BinaryCoding.decode(Unsigned.self, from: BinaryCoding.encode(["value": -1]))
        }
        #expect(throws: DecodingError.self) { try BinaryCoding.decode(Int.self, from: BinaryCoding.encode(1) + [0]) }
    }

    @Test func textThatIsNotUTF8IsRefusedAndEveryOtherTextReadsAsItself() throws {
        let samples: [[UInt8]] = [
            [], Array("plain".utf8), Array("é ü ☃︎ 𝄞 🧑‍🎨".utf8), [0x00, 0x7F],
            [0x80], [0xC0, 0xAF], [0xE2, 0x82], [0xED, 0xA0, 0x80], [0xFF], [0xF4, 0x90, 0x80, 0x80], Array("ok".utf8) + [0xC3],
            [0xEF, 0xBF, 0xBD],  // U+FFFD itself, which a repair would also produce
        ]
        for sample in samples {
            let expected = String(validating: sample, as: UTF8.self)
            #expect(utf8String(sample, 0..<sample.count) == expected, "\(sample)")
            // As a string value and as a key of the binary form.
            let value = [BinaryCoding.Tag.string.rawValue, UInt8(sample.count)] + sample
            let decoded = try? BinaryCoding.decode(String.self, from: value)
            #expect(decoded == expected, "\(sample)")
            let size = UInt32(1 + sample.count + 1)
            let keyed = [BinaryCoding.Tag.keyed.rawValue, UInt8(size), 0, 0, 0, UInt8(sample.count)] + sample + [BinaryCoding.Tag.null.rawValue]
            #expect((try? BinaryCoding.decode([String: String?].self, from: keyed))?.keys.first == expected, "\(sample)")
        }
    }

    @Test func isSmallerThanJSON() throws {
        var value = Everything()
        value.infinity = 1e300  // JSON has no infinity
        let binary = try BinaryCoding.encode(value)
        let json = try JSONEncoder().encode(value)
        #expect(binary.count < json.count)
    }

    @Test func garbageNeverCrashesTheDecoder() throws {
        var generator = SystemRandomNumberGenerator()
        // Random bytes.
        for _ in 0..<5000 {
            let bytes = (0..<Int.random(in: 0...80, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = try? BinaryCoding.decode(Everything.self, from: bytes)
            _ = try? BinaryCoding.decode(WorkerMessage.self, from: bytes)
        }
        // Every truncation of a valid value fails cleanly.
        let valid = try BinaryCoding.encode(Everything())
        for length in 0..<valid.count {
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(Everything.self, from: Array(valid.prefix(length))) }
        }
        // Random corruption of a valid value: an error or a value, never a trap.
        for _ in 0..<5000 {
            _ = try? BinaryCoding.decode(Everything.self, from: corrupted(valid, using: &generator))
        }
    }

    @Test func aNestingBombIsRefusedWithoutExhaustingTheStack() throws {
        // 100,000 arrays each holding the next: a few hundred kilobytes.
        let depth = 100_000
        var bytes: [UInt8] = []
        for level in 0..<depth {
            let size = UInt32((depth - level - 1) * 5)
            bytes += [BinaryCoding.Tag.array.rawValue, UInt8(size & 0xFF), UInt8(size >> 8 & 0xFF), UInt8(size >> 16 & 0xFF), UInt8(size >> 24)]
        }
        #expect(throws: DecodingError.self) { try BinaryCoding.decode([[[[Int]]]].self, from: bytes) }
        let recursive = try BinaryCoding.encode(["children": [[String: Int]]()])
        _ = try BinaryCoding.decode(Recursive.self, from: recursive)
        #expect(throws: DecodingError.self) { try BinaryCoding.decode(Recursive.self, from: Self.nestedChildren(200)) }
    }

    /// `{"children": [{"children": [...]}]}` nested `depth` deep.
    private static func nestedChildren(_ depth: Int) -> [UInt8] {
        var inner = try! BinaryCoding.encode(["children": [[String: Int]]()])
        for _ in 0..<depth {
            let array = [BinaryCoding.Tag.array.rawValue] + littleEndian(inner.count) + inner
            let body = [8] + Array("children".utf8) + array
            inner = [BinaryCoding.Tag.keyed.rawValue] + littleEndian(body.count) + body
        }
        return inner
    }

    private static func littleEndian(_ value: Int) -> [UInt8] {
        (0..<4).map { UInt8(truncatingIfNeeded: value >> ($0 * 8)) }
    }

    @Test func superEncodersFailClearlyInsteadOfWritingGarbage() {
        final class Base: Codable {}
        final class Derived: Codable {
            func encode(to encoder: any Encoder) throws {
                var container = encoder.container(keyedBy: CodingKeysForSuper.self)
                try Base().encode(to: container.superEncoder())
            }
        }
        #expect(throws: EncodingError.self) { try BinaryCoding.encode(Derived()) }
    }

    @Test func aClientChoosingJSONGetsJSONBackFromTheSameServer() async throws {
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withBusClients([.init(endpoint: endpoint, encoding: .json), .init(endpoint: endpoint, encoding: .binary)]) { clients in
            let (json, binary) = (clients[0], clients[1])
            // Both encodings against one server, typed replies and typed errors alike.
            let fromJSON = try await json.call(TestMethods.echo, Tagged(tag: 1, text: "json"))
            let fromBinary = try await binary.call(TestMethods.echo, Tagged(tag: 2, text: "binary"))
            #expect(fromJSON == Tagged(tag: 1, text: "json"))
            #expect(fromBinary == Tagged(tag: 2, text: "binary"))
            for client in [json, binary] {
                let error = await failure(client, BusMethod<Tagged, Tagged>("test.missing", roles: Set(BusRole.known)), Tagged(tag: 3, text: ""))
                #expect(error?.code == .unknownMethod)
            }
            // A JSON reply body is readable as it is.
            let outcome = await json.send(method: TestMethods.echo.name, body: Array(#"{"tag":4,"text":"raw"}"#.utf8), timeout: .seconds(5))
            guard case .reply(let body, let encoding) = outcome else {
                Issue.record("expected a reply, got \(outcome)")
                return
            }
            #expect(encoding == .json)
            #expect(String(decoding: body, as: UTF8.self).contains(#""text":"raw""#))
            }
        }
    }
}

private enum CodingKeysForSuper: CodingKey { case value }
