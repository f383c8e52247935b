import Testing
import TestSupport

@testable import Bus

@Suite("Wire format", .timeLimit(.minutes(5)))
struct WireFormatTests {
    @Test func requestHeaderRoundTrips() {
        let header = WireFormat.RequestHeader(encoding: .binary, requestId: 0xDEAD_BEEF_0102, deadlineMilliseconds: 1_795_000_000_123, method: "quota.reserve", traceId: "abc-123")
        #expect(WireFormat.decodeRequest(WireFormat.encodeRequest(header)) == .success(header))
    }

    @Test func aHeaderWithATraceContextRoundTripsAndOneWithoutKeepsTheOldShape() {
        var header = WireFormat.RequestHeader(encoding: .binary, requestId: 9, deadlineMilliseconds: 1, method: "jobs.create", traceId: "req-1")
        let plain = WireFormat.encodeRequest(header)
        header.traceContext = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        let traced = WireFormat.encodeRequest(header)
        #expect(WireFormat.decodeRequest(traced) == .success(header))
        // Without a context the header ends after the trace id, as it did before contexts existed
        #expect(traced.count == plain.count + 1 + 55)
        #expect(Array(traced.prefix(plain.count)) == plain)
        // A context cut short, or a zero length with nothing after, is malformed, not ignored
        for length in plain.count + 1..<traced.count {
            #expect(WireFormat.decodeRequest(Array(traced.prefix(length))) != .success(header), "\(length)")
            if case .success = WireFormat.decodeRequest(Array(traced.prefix(length))) { Issue.record("a \(length)-byte prefix decoded") }
        }
        #expect(WireFormat.decodeRequest(plain + [0]) == .failure(.malformed(requestId: 9, reason: "bad trace context length")))
    }

    @Test func everyTruncationOfAHeaderIsRejectedWithoutCrashing() {
        let bytes = WireFormat.encodeRequest(.init(encoding: .json, requestId: 42, deadlineMilliseconds: 1, method: "health", traceId: "t"))
        for length in 0..<bytes.count {
            switch WireFormat.decodeRequest(Array(bytes.prefix(length))) {
            case .success: Issue.record("a \(length)-byte prefix decoded")
            case .failure(.unreadable): #expect(length < 11)
            case .failure(.malformed(let id, _)): #expect(id == 42)
            }
        }
    }

    @Test func randomBytesAreDecodedOnlyWhenTheyAreAWholeHeader() {
        // Random bytes, and valid headers with random bytes changed: whatever decodes must encode
        // back to exactly the bytes it came from (nothing accepted loosely), and the rest fails
        // without a crash.
        var generator = SplitMix64(state: 2026)
        let valid = WireFormat.encodeRequest(.init(encoding: .binary, requestId: 77, deadlineMilliseconds: 5, method: "quota.status", traceId: "trace"))
        var decoded = 0
        for round in 0..<10_000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int.random(in: 0...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            } else {
                bytes = valid
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
            }
            if case .success(let header) = WireFormat.decodeRequest(bytes) {
                decoded += 1
                #expect(WireFormat.encodeRequest(header) == bytes, "decoded loosely: \(bytes)")
            }
            if let reply = WireFormat.decodeReplyHeader(bytes) {
                #expect(WireFormat.encodeReplyHeader(requestId: reply.requestId, kind: reply.kind, encoding: reply.encoding) == bytes)
            }
        }
        // Some of the changed valid headers still decode (a changed id or deadline byte): the
        // decoder was really exercised on both sides.
        #expect(decoded > 0 && decoded < 10_000)
    }

    @Test func replyHeaderRoundTrips() {
        let bytes = WireFormat.encodeReplyHeader(requestId: 9, kind: .error, encoding: .json)
        #expect(WireFormat.decodeReplyHeader(bytes)?.requestId == 9)
        #expect(WireFormat.decodeReplyHeader(bytes)?.kind == .error)
        #expect(WireFormat.decodeReplyHeader(bytes)?.encoding == .json)
        #expect(WireFormat.decodeReplyHeader(Array(bytes.dropLast())) == nil)
    }

    @Test func anUnknownBodyEncodingIsMalformedNotUnreadable() {
        var bytes = WireFormat.encodeRequest(.init(encoding: .binary, requestId: 7, deadlineMilliseconds: 1, method: "health", traceId: ""))
        bytes[2] = 9
        #expect(WireFormat.decodeRequest(bytes) == .failure(.malformed(requestId: 7, reason: "unknown body encoding 9")))
    }
}
