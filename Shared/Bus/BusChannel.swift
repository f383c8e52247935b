import DequeModule
import Foundation
import Logging
import Synchronization
import Threads
import ZeroMQ

/// A duplex message channel over ZeroMQ, for protocols in which either side may speak first (the
/// worker protocol): the binding side is a ROUTER that talks to many peers, the connecting side a
/// DEALER. Like `BusClient` and `BusServer`, its socket lives on a dedicated I/O thread, for as
/// long as `run()` runs (or the scope of `running(_:)`); messages arrive on `incoming` and leave
/// through `send`, both through bounded queues.
public final class BusChannel: Sendable {
    /// A connected peer of a binding channel (its ZeroMQ routing id).
    public struct Peer: Hashable, Sendable, CustomStringConvertible {
        let identity: [UInt8]
        public var description: String { identity.map { String(format: "%02x", $0) }.joined() }
    }

    /// A message received: from which peer (nil on a connecting channel) and its body.
    public struct Message: Sendable {
        public let peer: Peer?
        public let body: [UInt8]
    }

    enum Role { case bind, connect }

    private struct Outgoing {
        var peer: Peer?
        var body: [UInt8]
    }

    private struct State {
        var outbox: Deque<Outgoing> = []
        var wakeScheduled = false
        var started = false
        var stopping = false
        /// Whether the socket opened, once known; and those waiting to know.
        var opened: Result<Void, ZMQError>?
        var openWaiters: [CheckedContinuation<Result<Void, ZMQError>, Never>] = []
    }

    /// Messages as they arrive. Ends when the channel is shut down.
    public let incoming: AsyncStream<Message>
    private let continuation: AsyncStream<Message>.Continuation
    private let endpoint: String
    private let role: Role
    private let maxQueued: Int
    private let state = Mutex(State())
    private let wakeup = Wakeup()
    private let context: ZMQContext
    private let logger: Logger
    private let curveSecretKey: [UInt8]?
    private let knownCallers: Bool
    private let curveClient: CurveClientKeys?
    private let encoding: BusEncoding
    private let handshakeFailures: HandshakeFailures

    private init(role: Role, endpoint: String, maxQueued: Int, context: ZMQContext, logger: Logger, curveSecretKey: [UInt8]? = nil,
                 curveClient: CurveClientKeys? = nil, knownCallers: Bool = false, encoding: BusEncoding = .binary,
                 handshakeFailures: HandshakeFailures = HandshakeFailures()) {
        self.handshakeFailures = handshakeFailures
        self.encoding = encoding
        self.curveSecretKey = curveSecretKey
        self.knownCallers = knownCallers
        self.curveClient = curveClient
        self.role = role
        self.endpoint = endpoint
        self.maxQueued = maxQueued
        self.context = context
        self.logger = logger
        (incoming, continuation) = AsyncStream.makeStream(of: Message.self, bufferingPolicy: .bufferingOldest(maxQueued))
    }

    /// A ROUTER channel to bind on `endpoint` (CURVE with `curveSecretKey`; with `knownCallers`,
    /// only `worker` keys of the allow-list connect) when it runs.
    public static func binding(
        _ endpoint: String, maxQueued: Int = 10_000, curveSecretKey: [UInt8]? = nil, knownCallers: Bool = false, encoding: BusEncoding = .binary,
        context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.channel")
    ) -> BusChannel {
        BusChannel(role: .bind, endpoint: endpoint, maxQueued: maxQueued, context: context, logger: logger, curveSecretKey: curveSecretKey,
                   knownCallers: knownCallers, encoding: encoding)
    }

    /// A DEALER channel to connect to `endpoint` (CURVE with `curve`; libzmq reconnects by
    /// itself) when it runs. Failed handshakes are logged once each in `handshakeFailures`
    /// (the channel's own by default).
    public static func connecting(
        _ endpoint: String, maxQueued: Int = 10_000, curve: CurveClientKeys? = nil, encoding: BusEncoding = .binary,
        context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.channel"), handshakeFailures: HandshakeFailures = HandshakeFailures()
    ) -> BusChannel {
        BusChannel(role: .connect, endpoint: endpoint, maxQueued: maxQueued, context: context, logger: logger, curveClient: curve,
                   encoding: encoding, handshakeFailures: handshakeFailures)
    }

    /// Opens the socket on an I/O thread of its own and serves it until the task is cancelled;
    /// then sends nothing more and ends `incoming`. Throws if the socket cannot be opened (an
    /// endpoint that cannot be bound). A channel runs once: a second `run()` returns at once.
    public func run() async throws {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        try await withTaskCancellationHandler {
            try await IOThread.run(name: role == .bind ? "bus-channel-in" : "bus-channel") { [self] in ioLoop() }.get()
        } onCancel: {
            state.withLock { $0.stopping = true }
            wakeup.signal()
        }
    }

    /// Runs the channel for the duration of `body`: open before `body` is called (or the open's
    /// error thrown), closed when it returns or throws.
    public func running<T>(isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T) async throws -> T {
        // `run`'s error, if it cannot open, is `opened()`'s.
        try await whileRunning(isolation: isolation, { try? await self.run() }) {
            try await opened()
            return try await body()
        }
    }

    /// Returns once the socket is open; throws the error that kept it from opening.
    public func opened() async throws {
        let result = await withCheckedContinuation { (waiter: CheckedContinuation<Result<Void, ZMQError>, Never>) in
            let known = state.withLock { state -> Result<Void, ZMQError>? in
                if state.opened == nil { state.openWaiters.append(waiter) }
                return state.opened
            }
            if let known { waiter.resume(returning: known) }
        }
        try result.get()
    }

    private func settleOpen(_ result: Result<Void, ZMQError>) {
        let waiters = state.withLock { state -> [CheckedContinuation<Result<Void, ZMQError>, Never>] in
            state.opened = result
            defer { state.openWaiters.removeAll() }
            return state.openWaiters
        }
        for waiter in waiters { waiter.resume(returning: result) }
    }

    /// Queues `body` for `peer` (ignored on a connecting channel). Past `maxQueued` unsent
    /// messages the message is dropped and false returned: the protocols on top tolerate loss.
    @discardableResult
    public func send(_ body: [UInt8], to peer: Peer? = nil) -> Bool {
        let (accepted, wake) = state.withLock { state -> (Bool, Bool) in
            guard !state.stopping, state.outbox.count < maxQueued else { return (false, false) }
            state.outbox.append(Outgoing(peer: peer, body: body))
            defer { state.wakeScheduled = true }
            return (true, !state.wakeScheduled)
        }
        if wake { wakeup.signal() }
        return accepted
    }

    /// Encodes `message` (one byte naming the encoding, then the body in `BusEncoding`'s
    /// default: binary, or JSON under `BUS_ENCODING=json`) and queues it.
    @discardableResult
    public func send<T: Encodable>(_ message: T, to peer: Peer? = nil) -> Bool {
        guard let body = try? Self.encode(message, as: encoding) else { return false }
        return send(body, to: peer)
    }

    /// A message as `send` writes it: its encoding's byte, then the body.
    static func encode<T: Encodable>(_ message: T, as encoding: BusEncoding) throws -> [UInt8] {
        var bytes = [encoding.rawValue]
        bytes.append(contentsOf: try BusCodec.encode(message, as: encoding))
        return bytes
    }

    /// Decodes a message written by `send` as `T`, in whichever encoding it names; nil for garbage.
    public static func decode<T: Decodable>(_ type: T.Type, _ message: Message) -> T? {
        guard let first = message.body.first, let encoding = BusEncoding(rawValue: first) else { return nil }
        return try? BusCodec.decode(type, from: Array(message.body.dropFirst()), as: encoding)
    }

    private func ioLoop() -> Result<Void, ZMQError> {
        let socket: ZMQSocket
        do {
            socket = try ZMQSocket(role == .bind ? .router : .dealer, context: context)
            try socket.setLinger(milliseconds: role == .bind ? 1000 : 0)
            try socket.setHighWaterMarks(send: Int32(maxQueued), receive: Int32(maxQueued))
            try socket.setMaxMessageSize(1 << 20)
            try socket.setHeartbeat(interval: 1000, timeout: 3000)
            if let key = curveSecretKey {
                // Only worker keys, when callers are known by key (`BusAuthentication`).
                if knownCallers { try socket.setZAPDomain(BusAuthentication.workersDomain) }
                try socket.setCurveServer(secretKey: key)
            }
            if let curve = curveClient {
                try socket.setCurveClient(serverKey: curve.serverPublicKey, publicKey: curve.publicKey, secretKey: curve.secretKey)
            }
            if role == .bind {
                try socket.setRouterMandatory(true)
                try socket.bind(endpoint)
            } else {
                // Several endpoints (replicas of which one binds at a time, as jobs' elected
                // dispatcher does): messages go only to a connected one, and a newly bound
                // endpoint is found within a quarter second.
                let endpoints = endpoint.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                if endpoints.count > 1 { try socket.setImmediate(true) }
                try socket.setReconnect(interval: 100, maximum: endpoints.count > 1 ? 250 : 1000)
                for endpoint in endpoints { try socket.connect(endpoint) }
            }
        } catch {
            logger.error("channel cannot open", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            finish()
            settleOpen(.failure(error))
            return .failure(error)
        }
        settleOpen(.success(()))
        let handshakes = HandshakeLog(role: role, endpoint: endpoint, logger: logger, logged: handshakeFailures)
        let monitor = handshakes.monitor(socket)
        var poller = ZMQPoller()
        poller.addReadable(socket)
        let wakeIndex = poller.addReadable(fileDescriptor: wakeup.fileDescriptor)
        let monitorIndex = monitor.map { poller.addReadable($0) }
        // Swapped with the outbox each turn, as `BusClient`'s: nothing copied or allocated again.
        var batch = Deque<Outgoing>()
        while true {
            do {
                _ = try poller.poll(timeoutMilliseconds: -1)
            } catch {
                logger.error("zmq_poll failed", metadata: ["error": "\(error)"])
                break
            }
            if poller.isReadable(wakeIndex) { wakeup.drain() }
            if let monitor, let monitorIndex, poller.isReadable(monitorIndex) { handshakes.read(monitor) }
            let stopping = state.withLock { state in
                state.wakeScheduled = false
                swap(&batch, &state.outbox)
                return state.stopping
            }
            if stopping { break }
            for item in batch { transmit(item, on: socket) }
            batch.removeAll(keepingCapacity: true)
            for _ in 0..<1024 {
                guard let received = try? socket.receive(maxFrames: 2) else { break }
                guard case .frames(let frames) = received else { continue }
                switch (role, frames.count) {
                case (.bind, 2): continuation.yield(Message(peer: Peer(identity: frames[0]), body: frames[1]))
                case (.connect, 1): continuation.yield(Message(peer: nil, body: frames[0]))
                default: logger.debug("dropped a malformed channel message")
                }
            }
        }
        if let monitor {
            socket.stopMonitor()
            monitor.close()
        }
        socket.close()
        finish()
        return .success(())
    }

    private func transmit(_ item: Outgoing, on socket: ZMQSocket) {
        do {
            switch role {
            case .bind:
                guard let peer = item.peer else { return }
                try socket.send([peer.identity, item.body])
            case .connect:
                try socket.send([item.body])
            }
        } catch {
            // A peer gone (EHOSTUNREACH) or a full queue: the protocol's heartbeats notice.
            logger.debug("channel message dropped", metadata: ["error": "\(error)"])
        }
    }

    private func finish() {
        state.withLock { $0.stopping = true }
        continuation.finish()
    }
}

/// A channel's failed security handshakes, logged once per kind until one succeeds: a worker with
/// no key, another deployment's server key, or a key jobs does not list connects its socket and is
/// never answered, and without this neither side said why. (A key refused by the allow-list is
/// logged by `BusAuthentication` on the serving side.)
struct HandshakeLog {
    let role: BusChannel.Role
    let endpoint: String
    let logger: Logger
    let logged: HandshakeFailures

    init(role: BusChannel.Role, endpoint: String, logger: Logger, logged: HandshakeFailures) {
        self.role = role
        self.endpoint = endpoint
        self.logger = logger
        self.logged = logged
    }

    /// A PAIR socket hearing `socket`'s handshakes; nil (and the handshakes unlogged) if it
    /// cannot be set up.
    func monitor(_ socket: ZMQSocket) -> ZMQSocket? {
        do {
            return try socket.openMonitor("bus-channel", events: [.handshakeSucceeded, .handshakeFailedNoDetail, .handshakeFailedProtocol, .handshakeFailedAuth])
        } catch {
            logger.debug("channel cannot monitor its handshakes", metadata: ["error": "\(error)"])
            return nil
        }
    }

    func read(_ monitor: ZMQSocket) {
        while let message = try? monitor.receive(maxFrames: 2) {
            guard let (event, value) = ZMQSocket.monitorEventWithValue(message) else { continue }
            if event.contains(.handshakeSucceeded) {
                logged.reset()
            } else if let reason = reason(event, value), logged.first(reason) {
                logger.warning("bus handshake failed", metadata: ["endpoint": "\(endpoint)", "reason": "\(reason)"])
            }
        }
    }

    /// What a failed handshake most likely means, from this side; nil for what is logged elsewhere.
    func reason(_ event: ZMQSocket.Events, _ value: UInt32) -> String? {
        switch (role, event) {
        case (_, .handshakeFailedProtocol) where value == ZMQSocket.mechanismMismatch:
            return role == .bind
                ? "a peer connected without CURVE (its BUS_CURVE_PUBLIC is not set) or with it where this endpoint has none"
                : "the endpoint does not speak CURVE as this process does: BUS_CURVE_PUBLIC is set on one side only"
        case (.bind, .handshakeFailedProtocol) where value == ZMQSocket.cryptographicError:
            return "a peer's CURVE handshake did not decrypt: its BUS_CURVE_PUBLIC is not this service's public key"
        case (.bind, .handshakeFailedProtocol):
            return "a peer broke the handshake (protocol error 0x\(String(value, radix: 16)))"
        case (.connect, .handshakeFailedNoDetail):
            // (A service that is stopping or starting closes connections mid-handshake too: then
            // the next handshake succeeds, and a failure is logged again only after it.)
            return "the endpoint closed the connection during the handshake: BUS_CURVE_PUBLIC is not the services' public key, "
                + "unless the service was stopping or restarting then (if the next handshake succeeds, it was)"
        case (.connect, .handshakeFailedAuth):
            return "the endpoint refused this process's key: list its public key with its role in the service's BUS_CURVE_CLIENTS"
        case (.connect, .handshakeFailedProtocol):
            return "the handshake broke the protocol (error 0x\(String(value, radix: 16)))"
        default:
            return nil
        }
    }
}

/// The handshake failures already logged, until a handshake succeeds: one per channel by default,
/// or shared by the channels a caller opens one after another (a worker reconnecting), so a
/// refusal is logged once however often it recurs.
public final class HandshakeFailures: Sendable {
    private let reasons = Mutex<Set<String>>([])

    public init() {}

    /// Whether `reason` is new (and records it).
    func first(_ reason: String) -> Bool { reasons.withLock { $0.insert(reason).inserted } }
    func reset() { reasons.withLock { $0.removeAll() } }
}
