import BinaryWire
import Foundation
import Messages
import Testing
import ZeroMQ

@testable import Bus

/// Batches on the bus (WireFormat): calls queued in one turn of a client's loop leave in one
/// message, a server answers a batch in batches and a single request alone, and a client reads
/// replies either way. The far ends here are raw sockets, so what is on the wire is what is checked.
@Suite("Bus batches", .timeLimit(.minutes(2)))
struct BusBatchTests {
    @Test func callsQueuedInOneTurnLeaveInOneMessageAndRepliesAreReadSingleOrBatched() async throws {
        // Given a raw ROUTER standing in for a service
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let router = try ZMQSocket(.router)
        defer { router.close() }
        try router.setLinger(milliseconds: 0)
        try router.bind(endpoint)
        try await withBusClient(.init(endpoint: endpoint)) { client in
            // When 64 calls are made in one turn of the client's thread (tasks preferring its executor)
            let calls = Task(executorPreference: client.taskExecutor) {
                try await withThrowingTaskGroup(of: Tagged.self) { group in
                    for tag in 0..<64 { group.addTask { try await client.call(TestMethods.echo, Tagged(tag: tag, text: "batched")) } }
                    return try await group.reduce(into: [Tagged]()) { $0.append($1) }
                }
            }
            // Then they arrive as one message of 64 requests
            let frames = try await receiveMessage(on: router)
            #expect(frames.count == 1 + 2 * 64)
            let pairs = try #require(WireFormat.pairs(frames[1...]))
            let requests = try pairs.map { pair in
                guard case .success(let header) = WireFormat.decodeRequest(pair.header) else { throw BusError(.badRequest, "header") }
                return (header, pair.body)
            }
            #expect(Set(requests.map(\.0.requestId)).count == 64)
            // And replies come back both ways: ten alone, the rest in one message
            func reply(_ request: (WireFormat.RequestHeader, [UInt8])) -> [[UInt8]] {
                [WireFormat.encodeReplyHeader(requestId: request.0.requestId, kind: .reply, encoding: request.0.encoding), request.1]
            }
            for request in requests.prefix(10) { try router.send([frames[0]] + reply(request), wait: true) }
            try router.send([frames[0]] + requests.dropFirst(10).flatMap(reply), wait: true)
            let answered = try await calls.value
            #expect(answered.map(\.tag).sorted() == Array(0..<64))
        }
    }

    @Test func aServerAnswersABatchInOneMessageAndASingleRequestAlone() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        try await withServer(endpoint: endpoint) { _ in
            let dealer = try ZMQSocket(.dealer)
            defer { dealer.close() }
            try dealer.setLinger(milliseconds: 0)
            try dealer.connect(endpoint)
            let far = BusCodec.nowMilliseconds() + 60_000
            func request(_ id: UInt64) throws -> [[UInt8]] {
                [WireFormat.encodeRequest(.init(encoding: .binary, requestId: id, deadlineMilliseconds: far, method: "test.echo", traceId: "batch-test")),
                 try BinaryCoding.encode(Tagged(tag: Int(id), text: "in a batch"))]
            }
            // When ten requests come in one message
            try dealer.send((1...10).flatMap { try request(UInt64($0)) }, wait: true)
            // Then their ten replies come in one message (the handler answers at once, in the turn that read them)
            let batch = try await receiveMessage(on: dealer)
            let replies = try #require(WireFormat.pairs(batch[...]))
            #expect(replies.count == 10)
            for (header, body) in replies {
                let (id, kind, encoding) = try #require(WireFormat.decodeReplyHeader(header))
                #expect(kind == .reply)
                #expect(try BusCodec.decode(Tagged.self, from: body, as: encoding) == Tagged(tag: Int(id), text: "in a batch"))
            }
            #expect(Set(try replies.map { try #require(WireFormat.decodeReplyHeader($0.header)).requestId }) == Set(1...10))
            // And a single request gets a single reply, as a caller that never batches expects
            try dealer.send(try request(11), wait: true)
            let single = try await receiveMessage(on: dealer)
            #expect(single.count == 2)
            #expect(WireFormat.decodeReplyHeader(single[0])?.requestId == 11)
        }
    }
}

/// The next whole message on `socket`, waiting up to ten seconds for it.
private func receiveMessage(on socket: ZMQSocket) async throws -> [[UInt8]] {
    let deadline = ContinuousClock.now.advanced(by: .seconds(10))
    while ContinuousClock.now < deadline {
        if let received = try socket.receive(maxFrames: 512) {
            guard case .frames(let frames) = received else { throw BusError(.badRequest, "message over 512 frames") }
            return frames
        }
        try await Task.sleep(for: .milliseconds(5))
    }
    throw BusError(.timeout, "no message within ten seconds")
}
