import Foundation
import Messages
import Synchronization
import Testing
import ZeroMQ

@testable import Bus

@Suite("Bus failures", .timeLimit(.minutes(5)))
struct BusFailureTests {
    @Test func requestToAStoppedServiceFailsAsUnreachedAtItsDeadline() async throws {
        // Given nothing listening on the endpoint
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        try await withClient(endpoint: endpoint) { client in
            // When a request with a 500 ms deadline is sent
            let started = ContinuousClock.now
            let error = await failure(client, TestMethods.echo, Tagged(tag: 1, text: ""), timeout: .milliseconds(500))
            let elapsed = started.duration(to: .now)
            // Then it fails as `connection_lost` (it waited for a connection that never came: the
            // gateway answers 503, not the 504 of a service that was reached and did not answer),
            // not before the deadline, and it does not hang (the bound is far above the
            // deadline: a loaded 2-core machine, running the rest of the suite and a build beside
            // it, was seen to take 3.5 s)
            #expect(error?.code == .connectionLost)
            #expect(error?.retryable == true)
            #expect(elapsed >= .milliseconds(500))
            #expect(elapsed < .seconds(10))
        }
    }

    @Test func requestToAConnectedServiceThatDoesNotAnswerTimesOut() async throws {
        // Given a service that is up and connected, and holds every `wait` call
        let endpoint = uniqueInproc()
        let gate = Gate()
        try await withServer(endpoint: endpoint, router: testRouter(gate: gate)) { _ in
            try await withClient(endpoint: endpoint) { client in
                _ = try await client.call(TestMethods.echo, Tagged(tag: 0, text: "connected"))
                // When a call it holds has a 300 ms deadline
                let error = await failure(client, TestMethods.wait, 1, timeout: .milliseconds(300))
                // Then it fails as a timeout: the service was reached
                #expect(error?.code == .timeout)
                #expect(error?.retryable == true)
                gate.open()
            }
        }
    }

    @Test func requestPastTheInProgressBoundIsOverloadedAtOnce() async throws {
        // Given a server that holds at most 4 requests in progress, all 4 busy
        let endpoint = uniqueInproc()
        let gate = Gate()
        try await withServer(endpoint: endpoint, router: testRouter(gate: gate), maxInFlight: 4) { _ in
            try await withClient(endpoint: endpoint) { client in
                let slow = (0..<4).map { value in
                    Task { try await client.call(TestMethods.wait, value, timeout: .seconds(30)) }
                }
                while gate.arrived < 4 { try await Task.sleep(for: .milliseconds(5)) }
                // When a fifth arrives
                let error = await failure(client, TestMethods.wait, 99, timeout: .seconds(30))
                // Then it is refused as overloaded while the four are still held
                #expect(error?.code == .overloaded)
                #expect(error?.retryable == true)
                #expect(gate.arrived == 4)
                // And the four complete once released
                gate.open()
                var values: [Int] = []
                for task in slow { values.append(try await task.value) }
                #expect(values == [0, 1, 2, 3])
            }
        }
    }

    @Test func callerKeepsWorkingWhenTheServiceRestartsOnTheSameEndpoint() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        try await withClient(endpoint: endpoint) { client in
            // Given a caller that talked to the service
            try await withServer(endpoint: endpoint) { _ in
                let reply = try await client.call(TestMethods.echo, Tagged(tag: 1, text: "before"))
                #expect(reply.text == "before")
            }
            // When the service is gone, calls fail in bounded time: `connection_lost` (at the
            // deadline, or at once if the client hears of the closed connection only after
            // sending), or a timeout if it hears of it only after the deadline
            let whileDown = await failure(client, TestMethods.echo, Tagged(tag: 2, text: ""), timeout: .milliseconds(300))
            #expect([.timeout, .connectionLost].contains(whileDown?.code))
            // Then, once it is back on the same endpoint, the same caller's next request succeeds
            try await withServer(endpoint: endpoint) { _ in
                let reply = try await client.call(TestMethods.echo, Tagged(tag: 3, text: "after"), timeout: .seconds(5))
                #expect(reply == Tagged(tag: 3, text: "after"))
            }
        }
    }

    @Test func garbageOnTheSocketNeverStopsWellFormedRequests() async throws {
        // Given a service on tcp loopback
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        try await withServer(endpoint: endpoint) { _ in
            // When random bytes arrive on raw TCP connections
            var generator = SystemRandomNumberGenerator()
            for _ in 0..<20 {
                let size = Int.random(in: 1...4096, using: &generator)
                sendRawTCP(endpoint: endpoint, bytes: (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) })
            }
            // And malformed multipart messages arrive on a ZeroMQ connection
            let replies = try await sendMalformedMessages(endpoint: endpoint)
            // Then those whose sender and request id can be read get bad_request
            #expect(replies[77] == "bad_request")
            #expect(replies[78] == "bad_request")
            #expect(replies[79] == "bad_request")
            // (of a batch over the limit, the requests in the part read: the first 64)
            #expect((80..<144).allSatisfy { replies[$0] == "bad_request" })
            // And well-formed requests are still answered
            try await withClient(endpoint: endpoint) { client in
                let reply = try await client.call(TestMethods.echo, Tagged(tag: 5, text: "fine"))
                #expect(reply == Tagged(tag: 5, text: "fine"))
            }
        }
    }

    @Test func cancelledCallerStopsWaiting() async throws {
        let endpoint = uniqueInproc()
        let gate = Gate()
        try await withServer(endpoint: endpoint, router: testRouter(gate: gate)) { _ in
            try await withClient(endpoint: endpoint) { client in
                let call = Task { await failure(client, TestMethods.wait, 1, timeout: .seconds(30)) }
                while gate.arrived < 1 { try await Task.sleep(for: .milliseconds(5)) }
                call.cancel()
                #expect(await call.value?.code == .cancelled)
                gate.open()
            }
        }
    }

    @Test func clientRefusesPastItsOwnInFlightLimit() async throws {
        let endpoint = uniqueInproc()
        let gate = Gate()
        try await withServer(endpoint: endpoint, router: testRouter(gate: gate)) { _ in
            let client = try await withBusClient(.init(endpoint: endpoint, maxInFlight: 2)) { client in
                let held = (0..<2).map { value in Task { try await client.call(TestMethods.wait, value) } }
                while gate.arrived < 2 { try await Task.sleep(for: .milliseconds(5)) }
                let error = await failure(client, TestMethods.wait, 3)
                #expect(error?.code == .overloaded)
                gate.open()
                for task in held { _ = try await task.value }
                return client
            }
            // A client whose scope has ended refuses at once.
            #expect(await failure(client, TestMethods.echo, Tagged(tag: 1, text: ""))?.code == .unavailable)
        }
    }
}

/// Connects a plain TCP socket to `endpoint` and writes `bytes`, as a confused or hostile peer would.
private func sendRawTCP(endpoint: String, bytes: [UInt8]) {
    let port = UInt16(endpoint.split(separator: ":").last.flatMap { Int($0) } ?? 0)
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = port.bigEndian
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { return }
    _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
}

/// Sends malformed messages from a DEALER and collects the error codes of the replies, by request id.
private func sendMalformedMessages(endpoint: String) async throws -> [UInt64: String] {
    let dealer = try ZMQSocket(.dealer)
    defer { dealer.close() }
    try dealer.setLinger(milliseconds: 0)
    try dealer.connect(endpoint)
    let far = BusCodec.nowMilliseconds() + 60_000
    func header(id: UInt64, method: String = "test.echo") -> [UInt8] {
        WireFormat.encodeRequest(.init(encoding: .binary, requestId: id, deadlineMilliseconds: far, method: method, traceId: "garbage-test"))
    }
    let messages: [[[UInt8]]] = [
        [[1, 2, 3]],                                            // one short frame: dropped
        [[], []],                                               // empty frames: dropped
        [Array(repeating: 0xFF, count: 64), [1]],               // wrong version: dropped
        [Array(header(id: 77).prefix(15)), Array("{}".utf8)],   // truncated header: bad_request
        [header(id: 78), Array("{}".utf8), [9, 9, 9]],           // frames that do not pair up: bad_request
        Array(repeating: header(id: 79), count: 20),             // a batch of ten, each body a header: bad_request
        (0..<65).flatMap { [header(id: 80 + UInt64($0)), Array("{}".utf8)] },  // a batch over 64: bad_request, each read
    ]
    for message in messages { try dealer.send(message, wait: true) }

    var replies: [UInt64: String] = [:]
    let deadline = ContinuousClock.now.advanced(by: .seconds(5))
    while replies.count < 3 + 64 && ContinuousClock.now < deadline {
        guard let received = try dealer.receive(maxFrames: 256), case .frames(let frames) = received,
              let pairs = WireFormat.pairs(frames[...])
        else {
            try await Task.sleep(for: .milliseconds(10))
            continue
        }
        for (header, body) in pairs {
            let (id, kind, encoding) = try #require(WireFormat.decodeReplyHeader(header))
            #expect(kind == .error)
            replies[id] = try BusCodec.decode(BusError.self, from: body, as: encoding).code.rawValue
        }
    }
    return replies
}

@Suite("Bus with CURVE", .timeLimit(.minutes(5)))
struct BusCurveTests {
    @Test func curveServerAnswersCallersWithItsKeyAndNoOneElse() async throws {
        // Given a service bound with a CURVE secret key
        let server = try ZMQCurveKeyPair.generate()
        let client = try ZMQCurveKeyPair.generate()
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let bus = BusServer(
            configuration: .init(endpoint: endpoint, curveSecretKey: ZMQCurveKeyPair.decode(z85: server.secretKey)),
            router: testRouter(), logger: .init(label: "curve")
        )
        let running = Task { try await bus.run() }
        // When a caller knows the server's public key, the call succeeds, encrypted
        let keys = CurveClientKeys(
            serverPublicKey: try #require(ZMQCurveKeyPair.decode(z85: server.publicKey)),
            publicKey: try #require(ZMQCurveKeyPair.decode(z85: client.publicKey)),
            secretKey: try #require(ZMQCurveKeyPair.decode(z85: client.secretKey))
        )
        try await withBusClients([.init(endpoint: endpoint, curve: keys), .init(endpoint: endpoint)]) { clients in
        let (trusted, plain) = (clients[0], clients[1])
        let reply = try await trusted.call(TestMethods.echo, Tagged(tag: 1, text: "secret"), timeout: .seconds(5))
        #expect(reply.text == "secret")
        // Then a plain caller gets nowhere
        // (no connection before the deadline: `connection_lost`; or, caught between a refused handshake and libzmq's
        // reconnect, no connection to queue on: `overloaded` at once; or the refused handshake
        // drops the connection the request was sent on: `connection_lost`)
        let refused = await failure(plain, TestMethods.echo, Tagged(tag: 2, text: ""), timeout: .milliseconds(500))
        #expect([.overloaded, .connectionLost].contains(refused?.code), "\(String(describing: refused))")
        }
        bus.requestStop()
        try await running.value
    }

    /// A replica that answers `unavailable` (its database out of its reach: nothing done) does not
    /// fail the calls it gets while another replica serves: a retry-safe call goes again, to the
    /// other. A call not safe to send twice is not retried, and is answered `unavailable`.
    @Test func aRetrySafeCallAnsweredUnavailableByOneReplicaIsServedByTheOther() async throws {
        let safe = BusMethod<Tagged, Tagged>("test.safe", roles: Set(BusRole.known), retrySafe: true)
        let once = BusMethod<Tagged, Tagged>("test.once", roles: Set(BusRole.known))
        var cutOff = BusRouter()
        cutOff.register(safe) { _, _ in throw BusError(.unavailable, "the service's database cannot be reached now") }
        cutOff.register(once) { _, _ in throw BusError(.unavailable, "the service's database cannot be reached now") }
        var serving = BusRouter()
        serving.register(safe) { request, _ in request }
        serving.register(once) { request, _ in request }
        let (first, second) = ("tcp://127.0.0.1:\(freePort())", "tcp://127.0.0.1:\(freePort())")
        try await withServer(endpoint: first, router: cutOff) { [serving] _ in
            try await withServer(endpoint: second, router: serving) { _ in
                try await withClient(endpoint: "\(first),\(second)") { client in
                    // Given both replicas connected: a call not safe to retry is answered by
                    // each in turn, unavailable by one
                    var answeredBy: Set<Bool> = []
                    let end = ContinuousClock.now.advanced(by: .seconds(30))
                    while answeredBy.count < 2, ContinuousClock.now < end {
                        do {
                            _ = try await client.call(once, Tagged(tag: 0, text: "once"))
                            answeredBy.insert(true)
                        } catch {
                            if (error as? BusError)?.code == .unavailable { answeredBy.insert(false) }
                        }
                    }
                    #expect(answeredBy == [true, false])
                    // Then every retry-safe call is served
                    for tag in 0..<40 {
                        let reply = try await client.call(safe, Tagged(tag: tag, text: "safe"))
                        #expect(reply == Tagged(tag: tag, text: "safe"))
                    }
                }
            }
        }
    }
}

/// A retry that runs out of the deadline: the call ends with the failure it was retried after.
@Suite(.timeLimit(.minutes(2))) struct RetryPastTheDeadlineTests {
    /// A replica that answers `unavailable` late in the deadline (its database cut off: it waited
    /// for a connection until just before), and that does not answer the retry in what is left:
    /// the caller is told `unavailable`, what the service said, not `timeout` (a 504 at the
    /// gateway for what was a 503).
    @Test func aRetryThatTimesOutReportsTheUnavailableAnswer() async throws {
        let safe = BusMethod<Tagged, Tagged>("test.safe", roles: Set(BusRole.known), retrySafe: true)
        let calls = Mutex(0)
        var router = BusRouter()
        router.register(safe) { request, _ in
            let deadline = try #require(BusDeadline.current)
            let first = calls.withLock { calls in
                calls += 1
                return calls == 1
            }
            if first {
                // (A second before: time enough for the answer to arrive on a busy machine.)
                try await Task.sleep(until: deadline.advanced(by: .seconds(-1)))
                throw BusError(.unavailable, "the service's database cannot be reached now")
            }
            // The retry is answered only after its caller has given up.
            try await Task.sleep(until: deadline.advanced(by: .milliseconds(300)))
            return request
        }
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        try await withServer(endpoint: endpoint, router: router) { _ in
            try await withClient(endpoint: endpoint) { client in
                let error = await failure(client, safe, Tagged(tag: 1, text: "late"), timeout: .seconds(3))
                #expect(error?.code == .unavailable, "\(String(describing: error))")
                #expect(calls.withLock { $0 } == 2)
            }
        }
    }
}
