import BinaryWire

/// The bus's frames on the wire.
///
/// A request is two frames, `[header, body]` (a ROUTER sees the caller's routing id before them):
///
/// | bytes | field |
/// | --- | --- |
/// | 1 | protocol version (2) |
/// | 1 | kind: 0 request |
/// | 1 | body encoding: 0 JSON, 1 binary (`BinaryCoding`) |
/// | 8 | request id, little-endian, unique per caller socket |
/// | 8 | deadline, milliseconds since 1970 (UTC), little-endian |
/// | 1 + n | method name, length then UTF-8 (1 to 255 bytes) |
/// | 1 + m | trace id, length then UTF-8 (0 to 255 bytes) |
/// | 1 + k | optional: trace context, a W3C `traceparent` (length then UTF-8, 1 to 255 bytes) |
///
/// The trace context is there only when the caller traces (OpenTelemetry); a header without it
/// ends after the trace id, as before it existed.
///
/// A reply is `[header, body]` with a header of version, kind (1 reply, 2 error), body encoding
/// (the request's) and request id; the body is the reply, or for kind 2 the `BusError`
/// `{code, message, retryable}`, in that encoding.
///
/// **Batches.** One message may carry up to `maxBatch` requests, `[header, body, header, body, …]`:
/// a client sends everything queued for its socket in one message (one for each replica when it
/// has several, so calls made together still spread over them), so libzmq wakes its I/O thread
/// and the server's once for them all, and frames a batch in one write. A server answers the
/// requests of a batch in batches too (the replies ready in one turn of its loop, to one caller, in
/// one message), and a single request with a single reply, so a caller that never batches (an older
/// one, or the C diagnostic client) reads only what it always did. A client reads any number of
/// reply pairs in a message. Servers understand batches before callers send them: upgrade a
/// system's services before its gateways.
enum WireFormat {
    static let version: UInt8 = 2

    /// The most requests, or replies, in one message.
    static let maxBatch = 64

    /// The request or reply pairs of a message's frames (after a ROUTER's routing id); nil when the
    /// frames do not pair up.
    static func pairs(_ frames: ArraySlice<[UInt8]>) -> [(header: [UInt8], body: [UInt8])]? {
        guard !frames.isEmpty, frames.count % 2 == 0 else { return nil }
        var pairs: [(header: [UInt8], body: [UInt8])] = []
        pairs.reserveCapacity(frames.count / 2)
        var index = frames.startIndex
        while index < frames.endIndex {
            pairs.append((frames[index], frames[index + 1]))
            index += 2
        }
        return pairs
    }

    enum Kind: UInt8 {
        case request = 0
        case reply = 1
        case error = 2
    }

    struct RequestHeader: Equatable {
        var encoding: BusEncoding
        var requestId: UInt64
        var deadlineMilliseconds: Int64
        var method: String
        var traceId: String
        /// The caller's span as a W3C `traceparent`; empty when the caller does not trace.
        var traceContext: String = ""
    }

    /// Why a request header could not be read: whether its request id is known decides whether
    /// the sender can be told.
    enum HeaderProblem: Error, Equatable {
        /// Not even a request id could be read: nobody to answer.
        case unreadable
        /// The id was read but the rest is malformed: answer `bad_request`.
        case malformed(requestId: UInt64, reason: String)
    }

    static let fixedRequestBytes = 1 + 1 + 1 + 8 + 8
    static let replyHeaderBytes = 1 + 1 + 1 + 8

    static func encodeRequest(_ header: RequestHeader) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(fixedRequestBytes + 2 + header.method.utf8.count + header.traceId.utf8.count)
        bytes.append(version)
        bytes.append(Kind.request.rawValue)
        bytes.append(header.encoding.rawValue)
        appendLittleEndian(header.requestId, to: &bytes)
        appendLittleEndian(UInt64(bitPattern: header.deadlineMilliseconds), to: &bytes)
        let method = Array(header.method.utf8.prefix(255))
        bytes.append(UInt8(method.count))
        bytes.append(contentsOf: method)
        let trace = Array(header.traceId.utf8.prefix(255))
        bytes.append(UInt8(trace.count))
        bytes.append(contentsOf: trace)
        let context = Array(header.traceContext.utf8.prefix(255))
        if !context.isEmpty {
            bytes.append(UInt8(context.count))
            bytes.append(contentsOf: context)
        }
        return bytes
    }

    static func decodeRequest(_ bytes: [UInt8]) -> Result<RequestHeader, HeaderProblem> {
        guard bytes.count >= 11, bytes[0] == version, bytes[1] == Kind.request.rawValue else {
            return .failure(.unreadable)
        }
        let requestId = readLittleEndian(bytes, at: 3)
        guard let encoding = BusEncoding(rawValue: bytes[2]) else {
            return .failure(.malformed(requestId: requestId, reason: "unknown body encoding \(bytes[2])"))
        }
        guard bytes.count >= fixedRequestBytes + 2 else {
            return .failure(.malformed(requestId: requestId, reason: "request header too short"))
        }
        let deadline = Int64(bitPattern: readLittleEndian(bytes, at: 11))
        var index = fixedRequestBytes
        let methodCount = Int(bytes[index])
        index += 1
        guard methodCount > 0, index + methodCount < bytes.count else {
            return .failure(.malformed(requestId: requestId, reason: "bad method name length"))
        }
        let methodBytes = bytes[index..<index + methodCount]
        index += methodCount
        let traceCount = Int(bytes[index])
        index += 1
        guard index + traceCount <= bytes.count else {
            return .failure(.malformed(requestId: requestId, reason: "bad trace id length"))
        }
        let traceBytes = bytes[index..<index + traceCount]
        index += traceCount
        var contextBytes = bytes[index..<index]
        if index < bytes.count {
            let contextCount = Int(bytes[index])
            index += 1
            guard contextCount > 0, index + contextCount == bytes.count else {
                return .failure(.malformed(requestId: requestId, reason: "bad trace context length"))
            }
            contextBytes = bytes[index..<index + contextCount]
        }
        guard let method = utf8String(bytes, methodBytes.indices),
              let trace = utf8String(bytes, traceBytes.indices),
              let context = utf8String(bytes, contextBytes.indices)
        else {
            return .failure(.malformed(requestId: requestId, reason: "method, trace id or trace context is not UTF-8"))
        }
        return .success(RequestHeader(
            encoding: encoding, requestId: requestId, deadlineMilliseconds: deadline, method: method, traceId: trace, traceContext: context
        ))
    }

    static func encodeReplyHeader(requestId: UInt64, kind: Kind, encoding: BusEncoding) -> [UInt8] {
        var bytes: [UInt8] = [version, kind.rawValue, encoding.rawValue]
        bytes.reserveCapacity(replyHeaderBytes)
        appendLittleEndian(requestId, to: &bytes)
        return bytes
    }

    /// Reads a reply header; nil for anything that is not exactly one.
    static func decodeReplyHeader(_ bytes: [UInt8]) -> (requestId: UInt64, kind: Kind, encoding: BusEncoding)? {
        guard bytes.count == replyHeaderBytes, bytes[0] == version, let kind = Kind(rawValue: bytes[1]), kind != .request,
              let encoding = BusEncoding(rawValue: bytes[2])
        else {
            return nil
        }
        return (readLittleEndian(bytes, at: 3), kind, encoding)
    }

    private static func appendLittleEndian(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 0, to: 64, by: 8) {
            bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
        }
    }

    private static func readLittleEndian(_ bytes: [UInt8], at offset: Int) -> UInt64 {
        var value: UInt64 = 0
        for index in 0..<8 {
            value |= UInt64(bytes[offset + index]) << UInt64(index * 8)
        }
        return value
    }
}
