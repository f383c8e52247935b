import Testing

@testable import Bus

@Suite("Wire format")
struct WireFormatTests {
    @Test func requestHeaderRoundTrips() {
        let header = WireFormat.RequestHeader(encoding: .binary, requestId: 0xDEAD_BEEF_0102, deadlineMilliseconds: 1_795_000_000_123, method: "quota.reserve", traceId: "abc-123")
        #expect(WireFormat.decodeRequest(WireFormat.encodeRequest(header)) == .success(header))
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

    @Test func randomBytesNeverCrashTheDecoders() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<10_000 {
            let bytes = (0..<Int.random(in: 0...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = WireFormat.decodeRequest(bytes)
            _ = WireFormat.decodeReplyHeader(bytes)
        }
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
