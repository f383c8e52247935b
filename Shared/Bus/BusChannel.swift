import DequeModule
import Foundation
import Logging
import Synchronization
import ZeroMQ

/// A duplex message channel over ZeroMQ, for protocols in which either side may speak first (the
/// worker protocol): the binding side is a ROUTER that talks to many peers, the connecting side a
/// DEALER. Like `BusClient` and `BusServer`, its socket lives on a dedicated I/O thread; messages
/// arrive on `incoming` and leave through `send`, both through bounded queues.
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

    private enum Role { case bind, connect }

    private struct Outgoing {
        var peer: Peer?
        var body: [UInt8]
    }

    private struct State {
        var outbox: Deque<Outgoing> = []
        var wakeScheduled = false
        var stopping = false
        var stopped = false
        var onStopped: [CheckedContinuation<Void, Never>] = []
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

    private init(role: Role, endpoint: String, maxQueued: Int, context: ZMQContext, logger: Logger, curveSecretKey: [UInt8]? = nil,
                 curveClient: CurveClientKeys? = nil, knownCallers: Bool = false, encoding: BusEncoding = .binary) {
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

    /// Binds a ROUTER channel on `endpoint` (CURVE with `curveSecretKey`; with `knownCallers`,
    /// only `worker` keys of the allow-list connect); throws if the endpoint cannot be bound.
    public static func bind(
        _ endpoint: String, maxQueued: Int = 10_000, curveSecretKey: [UInt8]? = nil, knownCallers: Bool = false, encoding: BusEncoding = .binary,
        context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.channel")
    ) async throws -> BusChannel {
        let channel = BusChannel(role: .bind, endpoint: endpoint, maxQueued: maxQueued, context: context, logger: logger, curveSecretKey: curveSecretKey,
                                 knownCallers: knownCallers, encoding: encoding)
        try await channel.start()
        return channel
    }

    /// Connects a DEALER channel to `endpoint` (CURVE with `curve`; libzmq reconnects by itself).
    public static func connect(
        _ endpoint: String, maxQueued: Int = 10_000, curve: CurveClientKeys? = nil, encoding: BusEncoding = .binary,
        context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.channel")
    ) async throws -> BusChannel {
        let channel = BusChannel(role: .connect, endpoint: endpoint, maxQueued: maxQueued, context: context, logger: logger, curveClient: curve,
                                 encoding: encoding)
        try await channel.start()
        return channel
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

    /// Stops the I/O thread, sends nothing more and ends `incoming`. Idempotent.
    public func shutdown() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let stopped = state.withLock { state -> Bool in
                if state.stopped { return true }
                state.stopping = true
                state.onStopped.append(waiter)
                return false
            }
            if stopped { waiter.resume() } else { wakeup.signal() }
        }
    }

    private func start() async throws {
        let result: Result<Void, ZMQError> = await withCheckedContinuation { started in
            IOThread.start(name: role == .bind ? "bus-channel-in" : "bus-channel") { [self] in
                ioLoop(started: started)
            }
        }
        try result.get()
    }

    private func ioLoop(started: CheckedContinuation<Result<Void, ZMQError>, Never>) {
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
                try socket.setReconnect(interval: 100, maximum: 1000)
                try socket.connect(endpoint)
            }
        } catch {
            logger.error("channel cannot open", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            finish()
            started.resume(returning: .failure(error))
            return
        }
        started.resume(returning: .success(()))
        var poller = ZMQPoller()
        poller.addReadable(socket)
        let wakeIndex = poller.addReadable(fileDescriptor: wakeup.fileDescriptor)
        while true {
            do {
                _ = try poller.poll(timeoutMilliseconds: -1)
            } catch {
                logger.error("zmq_poll failed", metadata: ["error": "\(error)"])
                break
            }
            if poller.isReadable(wakeIndex) { wakeup.drain() }
            let (batch, stopping) = state.withLock { state in
                state.wakeScheduled = false
                let batch = state.outbox
                state.outbox.removeAll(keepingCapacity: true)
                return (batch, state.stopping)
            }
            if stopping { break }
            for item in batch { transmit(item, on: socket) }
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
        socket.close()
        finish()
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
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.stopped = true
            state.stopping = true
            defer { state.onStopped.removeAll() }
            return state.onStopped
        }
        continuation.finish()
        for waiter in waiters { waiter.resume() }
    }
}
