import Clibzmq

/// Waits for readiness on sockets and plain file descriptors together (`zmq_poll`).
public struct ZMQPoller {
    private var items: [zmq_pollitem_t] = []

    public init() {}

    /// Adds a socket to wait on for incoming messages; returns its index.
    @discardableResult
    public mutating func addReadable(_ socket: ZMQSocket) -> Int {
        items.append(zmq_pollitem_t(socket: socket.handle, fd: -1, events: Int16(ZMQ_POLLIN), revents: 0))
        return items.count - 1
    }

    /// Adds a file descriptor (such as an eventfd) to wait on for readability; returns its index.
    @discardableResult
    public mutating func addReadable(fileDescriptor: Int32) -> Int {
        items.append(zmq_pollitem_t(socket: nil, fd: fileDescriptor, events: Int16(ZMQ_POLLIN), revents: 0))
        return items.count - 1
    }

    /// Waits up to `timeoutMilliseconds` (-1: without limit) for any item to become readable
    /// (`zmq_poll`). Returns how many are ready; an interrupting signal counts as none.
    public mutating func poll(timeoutMilliseconds: Int) throws(ZMQError) -> Int {
        let count = Int32(items.count)
        let rc = items.withUnsafeMutableBufferPointer { zmq_poll($0.baseAddress, count, timeoutMilliseconds) }
        if rc < 0 {
            let error = ZMQError.current
            if error == .interrupted { return 0 }
            throw error
        }
        return Int(rc)
    }

    /// Whether the item at `index` was readable in the last `poll`.
    public func isReadable(_ index: Int) -> Bool {
        items[index].revents & Int16(ZMQ_POLLIN) != 0
    }
}

/// A CURVE key pair in Z85 text (`zmq_curve_keypair`), 40 characters each.
public struct ZMQCurveKeyPair: Sendable {
    public let publicKey: String
    public let secretKey: String

    public init(publicKey: String, secretKey: String) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }

    /// Generates a new key pair (`zmq_curve_keypair`).
    public static func generate() throws(ZMQError) -> ZMQCurveKeyPair {
        var publicKey = [CChar](repeating: 0, count: 41)
        var secretKey = [CChar](repeating: 0, count: 41)
        try zmqTry(zmq_curve_keypair(&publicKey, &secretKey))
        return ZMQCurveKeyPair(publicKey: text(publicKey), secretKey: text(secretKey))
    }

    private static func text(_ characters: [CChar]) -> String {
        String(decoding: characters.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The public key of a Z85 secret key (`zmq_curve_public`); nil if malformed.
    public static func publicKey(ofSecret secret: String) -> String? {
        guard secret.utf8.count == 40 else { return nil }
        var publicKey = [CChar](repeating: 0, count: 41)
        guard zmq_curve_public(&publicKey, secret) == 0 else { return nil }
        return text(publicKey)
    }

    /// Encodes 32 key bytes as Z85 text (`zmq_z85_encode`).
    public static func encode(_ key: [UInt8]) -> String {
        var characters = [CChar](repeating: 0, count: 41)
        _ = key.withUnsafeBufferPointer { zmq_z85_encode(&characters, $0.baseAddress, 32) }
        return text(characters)
    }

    /// Decodes a 40-character Z85 key into its 32 bytes (`zmq_z85_decode`); nil if malformed.
    public static func decode(z85 text: String) -> [UInt8]? {
        guard text.utf8.count == 40 else { return nil }
        var bytes = [UInt8](repeating: 0, count: 32)
        let ok = bytes.withUnsafeMutableBufferPointer { zmq_z85_decode($0.baseAddress, text) != nil }
        return ok ? bytes : nil
    }
}
