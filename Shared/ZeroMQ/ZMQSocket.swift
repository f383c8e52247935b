import Clibzmq
import Foundation
import Synchronization

/// A libzmq socket (`zmq_socket`). Not thread-safe: create it on the thread that uses it and use
/// it from that thread only, which is why it is not `Sendable`.
public final class ZMQSocket {
    /// The socket patterns the bus uses.
    public enum Kind: Sendable {
        case router, dealer, pair, pub, sub, rep

        var rawValue: Int32 {
            switch self {
            case .rep: ZMQ_REP
            case .router: ZMQ_ROUTER
            case .dealer: ZMQ_DEALER
            case .pair: ZMQ_PAIR
            case .pub: ZMQ_PUB
            case .sub: ZMQ_SUB
            }
        }
    }

    let handle: UnsafeMutableRawPointer
    private let context: ZMQContext
    private var closed = false
    /// With `readsUserId`, `receive` keeps here the `User-Id` the ZAP handler gave the sender
    /// of the last message (its role), nil when it had none.
    public var readsUserId = false
    public private(set) var lastUserId: String?

    /// Opens a socket of `kind` in `context` (`zmq_socket`).
    public init(_ kind: Kind, context: ZMQContext = .shared) throws(ZMQError) {
        guard let handle = zmq_socket(context.handle, kind.rawValue) else { throw .current }
        self.handle = handle
        self.context = context
    }

    deinit { close() }

    /// Closes the socket (`zmq_close`); pending outgoing frames are kept for the linger period.
    public func close() {
        guard !closed else { return }
        closed = true
        zmq_close(handle)
    }

    // MARK: Endpoints

    /// Binds to `endpoint` (`zmq_bind`), such as `tcp://127.0.0.1:7001` or `inproc://quota`.
    public func bind(_ endpoint: String) throws(ZMQError) {
        try zmqTry(zmq_bind(handle, endpoint))
    }

    /// Connects to `endpoint` (`zmq_connect`); libzmq reconnects by itself when the peer goes away.
    public func connect(_ endpoint: String) throws(ZMQError) {
        try zmqTry(zmq_connect(handle, endpoint))
    }

    /// Stops listening on `endpoint` (`zmq_unbind`).
    public func unbind(_ endpoint: String) throws(ZMQError) {
        try zmqTry(zmq_unbind(handle, endpoint))
    }

    /// The endpoint last bound, with the real port for a `tcp://host:*` bind (`ZMQ_LAST_ENDPOINT`).
    public func lastEndpoint() throws(ZMQError) -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        var size = buffer.count
        try zmqTry(zmq_getsockopt(handle, ZMQ_LAST_ENDPOINT, &buffer, &size))
        let bytes = buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }
        return String(decoding: bytes, as: UTF8.self)
    }

    // MARK: Readiness outside zmq_poll

    /// The file descriptor that becomes readable when the socket may have changed state
    /// (`ZMQ_FD`), for an event loop of another library to watch. It is libzmq's to read: it
    /// signals edges, not levels, so after it fires, and after every send, the owner asks
    /// `isReadable` (which consumes the signal) and receives until it is false.
    public func fileDescriptor() throws(ZMQError) -> Int32 {
        var fd: Int32 = -1
        var size = MemoryLayout<Int32>.size
        try zmqTry(zmq_getsockopt(handle, ZMQ_FD, &fd, &size))
        return fd
    }

    /// Whether a message is waiting to be received (`ZMQ_EVENTS` has `ZMQ_POLLIN`). Asking
    /// processes libzmq's pending commands for the socket, as `zmq_poll` does.
    public var isReadable: Bool {
        var events: Int32 = 0
        var size = MemoryLayout<Int32>.size
        guard zmq_getsockopt(handle, ZMQ_EVENTS, &events, &size) == 0 else { return false }
        return events & Int32(ZMQ_POLLIN) != 0
    }

    // MARK: Monitoring

    /// Connection events a monitor reports (`ZMQ_EVENT_*`).
    public struct Events: OptionSet, Sendable {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }
        public static let connected = Events(rawValue: Int32(ZMQ_EVENT_CONNECTED))
        public static let disconnected = Events(rawValue: Int32(ZMQ_EVENT_DISCONNECTED))
        /// A reconnection was scheduled (after a failed attempt, or after a disconnection).
        public static let connectRetried = Events(rawValue: Int32(ZMQ_EVENT_CONNECT_RETRIED))
        /// A security handshake completed (the peer is who it must be).
        public static let handshakeSucceeded = Events(rawValue: Int32(ZMQ_EVENT_HANDSHAKE_SUCCEEDED))
        /// The connection closed during the handshake (a CURVE client whose server key is wrong).
        public static let handshakeFailedNoDetail = Events(rawValue: Int32(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
        /// The handshake broke the protocol; the value is a `ZMQ_PROTOCOL_ERROR_*` code.
        public static let handshakeFailedProtocol = Events(rawValue: Int32(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))
        /// The ZAP handler refused the peer; the value is its status code (400).
        public static let handshakeFailedAuth = Events(rawValue: Int32(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))
    }

    /// `ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH`: one side uses CURVE, the other not.
    public static let mechanismMismatch = UInt32(ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    /// `ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC`: a CURVE box did not open (the wrong server key).
    public static let cryptographicError = UInt32(ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)

    /// Publishes this socket's `events` on a PAIR socket bound at `address` (an `inproc://`
    /// address of the same context) that a monitor connects to (`zmq_socket_monitor`).
    public func monitor(_ address: String, events: Events) throws(ZMQError) {
        try zmqTry(zmq_socket_monitor(handle, address, events.rawValue))
    }

    private static let monitors = Atomic<Int>(0)

    /// A PAIR socket (no linger) that hears this socket's `events`, published on an `inproc://`
    /// address of its own named after `name`. Read it with `monitorEvent`; call `stopMonitor`
    /// before closing it.
    public func openMonitor(_ name: String, events: Events) throws(ZMQError) -> ZMQSocket {
        let address = "inproc://\(name)-monitor-\(getpid())-\(Self.monitors.add(1, ordering: .relaxed).newValue)"
        try monitor(address, events: events)
        let monitor = try ZMQSocket(.pair, context: context)
        try monitor.setLinger(milliseconds: 0)
        try monitor.connect(address)
        return monitor
    }

    /// Stops publishing events (`zmq_socket_monitor` with no address). Call it before closing the
    /// monitor's reader: libzmq's I/O thread blocks sending an event nobody will read, and with
    /// it every socket of the context.
    public func stopMonitor() {
        _ = zmq_socket_monitor(handle, nil, 0)
    }

    /// The event a monitor socket received: its first frame is a 16-bit event and a 32-bit value
    /// (host order), its second the endpoint. Nil for anything else.
    public static func monitorEvent(_ message: ReceivedMessage) -> (event: Events, endpoint: String)? {
        guard case .frames(let frames) = message, frames.count == 2, frames[0].count == 6 else { return nil }
        let event = frames[0].withUnsafeBytes { $0.loadUnaligned(as: UInt16.self) }
        return (Events(rawValue: Int32(event)), String(decoding: frames[1], as: UTF8.self))
    }

    /// A monitor's event with its value (an error code, a status).
    public static func monitorEventWithValue(_ message: ReceivedMessage) -> (event: Events, value: UInt32)? {
        guard case .frames(let frames) = message, frames.count == 2, frames[0].count == 6 else { return nil }
        let event = frames[0].withUnsafeBytes { $0.loadUnaligned(as: UInt16.self) }
        let value = frames[0].withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 2, as: UInt32.self) }
        return (Events(rawValue: Int32(event)), value)
    }

    // MARK: Sending and receiving

    /// Sends `frames` as one multipart message (`zmq_send`, `ZMQ_SNDMORE` on all but the last).
    /// With `wait: false` a full queue throws `ZMQError.wouldBlock` before anything is sent.
    public func send(_ frames: [[UInt8]], wait: Bool = false) throws(ZMQError) {
        precondition(!frames.isEmpty, "a message has at least one frame")
        let lastIndex = frames.count - 1
        for (index, frame) in frames.enumerated() {
            var flags: Int32 = index < lastIndex ? ZMQ_SNDMORE : 0
            // libzmq delivers multipart messages atomically: once the first frame is accepted the
            // rest are too, so only the first may be refused for a full queue.
            if !wait && index == 0 { flags |= ZMQ_DONTWAIT }
            let rc = frame.withUnsafeBytes { zmq_send(handle, $0.baseAddress, $0.count, flags) }
            try zmqTry(rc)
        }
    }

    /// Receives one whole multipart message (`zmq_msg_recv`). Returns `nil` when nothing is
    /// waiting and `wait` is false. A message of more than `maxFrames` frames is read to its end
    /// and reported as `.truncated` with its first frames, so a garbage sender cannot
    /// desynchronise the socket or make it hold an unbounded number of frames.
    public func receive(wait: Bool = false, maxFrames: Int = 16) throws(ZMQError) -> ReceivedMessage? {
        var frames: [[UInt8]] = []
        var overflow = false
        if readsUserId { lastUserId = nil }
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        while true {
            let flags: Int32 = (frames.isEmpty && !overflow && !wait) ? ZMQ_DONTWAIT : 0
            let rc = zmq_msg_recv(&message, handle, flags)
            if rc < 0 {
                let error = ZMQError.current
                if error == .wouldBlock && frames.isEmpty && !overflow { return nil }
                if error == .interrupted { continue }
                throw error
            }
            // A ROUTER's routing-id frame is its own and carries no metadata: read it from the
            // sender's frames.
            if readsUserId, let userId = zmq_msg_gets(&message, "User-Id") { lastUserId = String(cString: userId) }
            if frames.count < maxFrames {
                let size = zmq_msg_size(&message)
                if size == 0 {
                    frames.append([])
                } else {
                    let data = zmq_msg_data(&message)!.assumingMemoryBound(to: UInt8.self)
                    frames.append(Array(UnsafeBufferPointer(start: data, count: size)))
                }
            } else {
                overflow = true
            }
            if zmq_msg_more(&message) == 0 { break }
        }
        return overflow ? .truncated(frames) : .frames(frames)
    }

    /// One message read by `receive`.
    public enum ReceivedMessage: Sendable {
        /// The message's frames, in order.
        case frames([[UInt8]])
        /// The message had more frames than allowed: its first `maxFrames`, the rest discarded.
        case truncated([[UInt8]])
    }

    // MARK: Options

    /// Sets an integer option (`zmq_setsockopt`).
    public func setOption(_ option: Int32, _ value: Int32) throws(ZMQError) {
        var value = value
        try zmqTry(zmq_setsockopt(handle, option, &value, MemoryLayout<Int32>.size))
    }

    /// Sets a 64-bit integer option (`zmq_setsockopt`), such as `ZMQ_MAXMSGSIZE`.
    public func setOption(_ option: Int32, _ value: Int64) throws(ZMQError) {
        var value = value
        try zmqTry(zmq_setsockopt(handle, option, &value, MemoryLayout<Int64>.size))
    }

    /// Sets a binary option (`zmq_setsockopt`), such as a routing id or a CURVE key.
    public func setOption(_ option: Int32, bytes: [UInt8]) throws(ZMQError) {
        let rc = bytes.withUnsafeBytes { zmq_setsockopt(handle, option, $0.baseAddress, $0.count) }
        try zmqTry(rc)
    }

    /// How long, in milliseconds, unsent frames are kept after `close` (`ZMQ_LINGER`).
    public func setLinger(milliseconds: Int32) throws(ZMQError) { try setOption(ZMQ_LINGER, milliseconds) }

    /// The most messages queued for sending and for receiving (`ZMQ_SNDHWM`, `ZMQ_RCVHWM`).
    public func setHighWaterMarks(send: Int32, receive: Int32) throws(ZMQError) {
        try setOption(ZMQ_SNDHWM, send)
        try setOption(ZMQ_RCVHWM, receive)
    }

    /// The largest inbound message accepted; a peer sending more is disconnected (`ZMQ_MAXMSGSIZE`).
    public func setMaxMessageSize(_ bytes: Int64) throws(ZMQError) { try setOption(ZMQ_MAXMSGSIZE, bytes) }

    /// Reconnect delays in milliseconds for connecting sockets (`ZMQ_RECONNECT_IVL`, `ZMQ_RECONNECT_IVL_MAX`).
    public func setReconnect(interval: Int32, maximum: Int32) throws(ZMQError) {
        try setOption(ZMQ_RECONNECT_IVL, interval)
        try setOption(ZMQ_RECONNECT_IVL_MAX, maximum)
    }

    /// ZMTP heartbeats that find dead TCP peers (`ZMQ_HEARTBEAT_IVL`, `ZMQ_HEARTBEAT_TIMEOUT`).
    public func setHeartbeat(interval: Int32, timeout: Int32) throws(ZMQError) {
        try setOption(ZMQ_HEARTBEAT_IVL, interval)
        try setOption(ZMQ_HEARTBEAT_TIMEOUT, timeout)
    }

    /// Makes a ROUTER report unroutable messages as `hostUnreachable` (`ZMQ_ROUTER_MANDATORY`).
    public func setRouterMandatory(_ on: Bool) throws(ZMQError) { try setOption(ZMQ_ROUTER_MANDATORY, Int32(on ? 1 : 0)) }

    /// Queues messages only on completed connections (`ZMQ_IMMEDIATE`): a DEALER connected to
    /// several peers then sends nothing to one that is down and reconnecting.
    public func setImmediate(_ on: Bool) throws(ZMQError) { try setOption(ZMQ_IMMEDIATE, Int32(on ? 1 : 0)) }

    /// Makes this socket a CURVE server with `secretKey` (32 bytes): `ZMQ_CURVE_SERVER`, `ZMQ_CURVE_SECRETKEY`.
    /// Sets the ZAP domain (`ZMQ_ZAP_DOMAIN`): the authentication handler sees it with each
    /// connection and may admit different callers on different sockets.
    public func setZAPDomain(_ domain: String) throws(ZMQError) { try setOption(ZMQ_ZAP_DOMAIN, bytes: Array(domain.utf8)) }

    /// Sets the receive timeout in milliseconds (`ZMQ_RCVTIMEO`; -1 waits for ever).
    public func setReceiveTimeout(milliseconds: Int32) throws(ZMQError) { try setOption(ZMQ_RCVTIMEO, milliseconds) }

    public func setCurveServer(secretKey: [UInt8]) throws(ZMQError) {
        try setOption(ZMQ_CURVE_SERVER, 1 as Int32)
        try setOption(ZMQ_CURVE_SECRETKEY, bytes: secretKey)
    }

    /// Makes this socket a CURVE client of the server whose public key is `serverKey`:
    /// `ZMQ_CURVE_SERVERKEY`, `ZMQ_CURVE_PUBLICKEY`, `ZMQ_CURVE_SECRETKEY`.
    public func setCurveClient(serverKey: [UInt8], publicKey: [UInt8], secretKey: [UInt8]) throws(ZMQError) {
        try setOption(ZMQ_CURVE_SERVERKEY, bytes: serverKey)
        try setOption(ZMQ_CURVE_PUBLICKEY, bytes: publicKey)
        try setOption(ZMQ_CURVE_SECRETKEY, bytes: secretKey)
    }
}
