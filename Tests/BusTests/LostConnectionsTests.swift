import Foundation
import Testing
import ZeroMQ

@testable import Bus

/// A client takes a disconnection as final (and fails its calls in flight, retry-safe ones going
/// again) only once libzmq has scheduled the reconnection of the same endpoint: by then the dead
/// peer's pipe is out of the socket's routing, so a retry cannot be routed into it and lost.
@Suite("Lost connections", .timeLimit(.minutes(5)))
struct LostConnectionsTests {
    /// A monitor socket fed by hand: the events libzmq would publish, one at a time.
    struct FakeMonitor {
        let events: ZMQSocket
        let monitor: ZMQSocket
        let socket: ZMQSocket

        init() throws {
            let address = uniqueInproc()
            events = try ZMQSocket(.pair)
            try events.bind(address)
            monitor = try ZMQSocket(.pair)
            try monitor.connect(address)
            socket = try ZMQSocket(.dealer)
        }

        /// Publishes `event` for `endpoint` as `zmq_socket_monitor` does: a 16-bit event and a
        /// 32-bit value, then the endpoint.
        func publish(_ event: ZMQSocket.Events, _ endpoint: String) throws {
            var header = [UInt8](repeating: 0, count: 6)
            withUnsafeBytes(of: UInt16(truncatingIfNeeded: event.rawValue)) { header.replaceSubrange(0..<2, with: $0) }
            try events.send([header, Array(endpoint.utf8)], wait: true)
        }

        func close() {
            for socket in [events, monitor, socket] { socket.close() }
        }
    }

    @Test func aDisconnectionIsFinalOnceItsEndpointsReconnectionIsScheduled() throws {
        let fake = try FakeMonitor()
        defer { fake.close() }
        var lost = LostConnections(endpoints: ["tcp://127.0.0.1:7101"])
        let now = ContinuousClock.now
        try fake.publish(.disconnected, "tcp://127.0.0.1:7101")
        let alone = lost.confirmed(monitor: fake.monitor, socket: fake.socket, now: now)
        #expect(!alone)
        #expect(lost.nextCheck == now.advanced(by: LostConnections.grace))
        // Another endpoint retrying (a replica that is down) says nothing about this one
        try fake.publish(.connectRetried, "tcp://127.0.0.1:7111")
        let afterAnother = lost.confirmed(monitor: fake.monitor, socket: fake.socket, now: now)
        #expect(!afterAnother)
        try fake.publish(.connectRetried, "tcp://127.0.0.1:7101")
        let afterItsOwn = lost.confirmed(monitor: fake.monitor, socket: fake.socket, now: now)
        #expect(afterItsOwn)
        #expect(lost.nextCheck == nil)
    }

    @Test func aDisconnectionWhoseReconnectionIsNeverHeardIsFinalAfterTheGrace() throws {
        let fake = try FakeMonitor()
        defer { fake.close() }
        var lost = LostConnections(endpoints: ["tcp://127.0.0.1:7101"])
        let now = ContinuousClock.now
        try fake.publish(.disconnected, "tcp://127.0.0.1:7101")
        let atFirst = lost.confirmed(monitor: fake.monitor, socket: fake.socket, now: now)
        #expect(!atFirst)
        let justBefore = lost.confirmed(monitor: nil, socket: fake.socket, now: now.advanced(by: .milliseconds(999)))
        #expect(!justBefore)
        let atTheGrace = lost.confirmed(monitor: nil, socket: fake.socket, now: now.advanced(by: LostConnections.grace))
        #expect(atTheGrace)
        #expect(lost.nextCheck == nil)
    }

    @Test func anEndpointIsConnectedFromItsHandshakeToItsDisconnectionOrFailedAttempt() throws {
        let fake = try FakeMonitor()
        defer { fake.close() }
        var lost = LostConnections(endpoints: ["tcp://127.0.0.1:7101", "tcp://127.0.0.1:7111"])
        /// Whether a connection is up once `event` of `port`'s endpoint is heard.
        func connected(after event: ZMQSocket.Events, _ port: Int) throws -> Bool {
            try fake.publish(event, "tcp://127.0.0.1:\(port)")
            _ = lost.confirmed(monitor: fake.monitor, socket: fake.socket)
            return lost.connected
        }
        // Not before any handshake: a call sent now waits in libzmq's queue
        #expect(!lost.connected)
        #expect(try connected(after: .handshakeSucceeded, 7101))
        // Another endpoint's failed attempt says nothing about this one
        #expect(try connected(after: .connectRetried, 7111))
        #expect(try !connected(after: .disconnected, 7101))
        #expect(try connected(after: .handshakeSucceeded, 7111))
        #expect(try !connected(after: .connectRetried, 7111))
        // An inproc endpoint has no handshake to hear: always connected
        #expect(LostConnections(endpoints: ["inproc://jobs"]).connected)
        // Nor has a socket without a monitor: nothing is heard, so it is taken for connected
        #expect(LostConnections(endpoints: ["tcp://127.0.0.1:7101"], monitored: false).connected)
    }

    @Test func libzmqNamesTheEndpointAlikeInTheHandshakeTheDisconnectionAndTheReconnectionThatFollows() async throws {
        // Given a DEALER connected to a ROUTER over TCP, monitored as a client monitors
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let router = try ZMQSocket(.router)
        try router.bind(endpoint)
        let dealer = try ZMQSocket(.dealer)
        defer { dealer.close() }
        try dealer.setLinger(milliseconds: 0)
        try dealer.setReconnect(interval: 100, maximum: 1000)
        let address = uniqueInproc()
        try dealer.monitor(address, events: [.connected, .handshakeSucceeded, .disconnected, .connectRetried])
        let monitor = try ZMQSocket(.pair)
        try monitor.connect(address)
        defer {
            dealer.stopMonitor()
            monitor.close()
        }
        try dealer.connect(endpoint)
        func next() throws -> (event: ZMQSocket.Events, endpoint: String)? {
            try monitor.receive(maxFrames: 2).flatMap(ZMQSocket.monitorEvent)
        }
        var seen: [(event: ZMQSocket.Events, endpoint: String)] = []
        try await waitFor { if let event = try next() { seen.append(event) }; return seen.contains { $0.event == .handshakeSucceeded } }
        // When the peer goes away
        router.close()
        // Then the disconnection and then the reconnection come, naming the endpoint alike, and
        // as the handshake before them did
        try await waitFor { if let event = try next() { seen.append(event) }; return seen.contains { $0.event == .connectRetried } }
        let handshake = try #require(seen.firstIndex { $0.event == .handshakeSucceeded })
        let disconnected = try #require(seen.firstIndex { $0.event == .disconnected })
        let retried = try #require(seen.firstIndex { $0.event == .connectRetried })
        #expect(handshake < disconnected)
        #expect(disconnected < retried)
        #expect(seen[handshake].endpoint == seen[disconnected].endpoint)
        #expect(seen[disconnected].endpoint == seen[retried].endpoint)
        #expect(seen[retried].endpoint == endpoint)
    }

    /// Polls `condition` until it holds, a few milliseconds apart, with a bound no loaded machine
    /// comes near.
    func waitFor(_ condition: () throws -> Bool) async throws {
        let limit = ContinuousClock.now.advanced(by: .seconds(60))
        while try !condition() {
            guard ContinuousClock.now < limit else { throw CancellationError() }
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}
