/// The part of CBOR (RFC 8949) an App Attest attestation object uses, decoded from untrusted bytes:
/// unsigned and negative integers, byte and text strings, arrays, maps, tags (their content kept)
/// and the simple values; no floating point. Definite lengths only (Apple's encoder writes no indefinite ones);
/// nesting, item counts and lengths are checked against the input before anything is allocated,
/// so a forged length cannot make the decoder reserve memory it was not sent.
public enum CBOR: Equatable, Sendable {
    case unsigned(UInt64)
    case negative(UInt64)  // the value is -1 - n
    case bytes([UInt8])
    case text(String)
    case array([CBOR])
    case map([(CBOR, CBOR)])
    case tagged(UInt64, Box)
    case simple(UInt8)  // 20 false, 21 true, 22 null, 23 undefined

    /// A tagged item's content (an enum cannot hold itself directly).
    public final class Box: Equatable, Sendable {
        public let value: CBOR
        init(_ value: CBOR) { self.value = value }
        public static func == (lhs: Box, rhs: Box) -> Bool { lhs.value == rhs.value }
    }

    public static func == (lhs: CBOR, rhs: CBOR) -> Bool {
        switch (lhs, rhs) {
        case (.unsigned(let a), .unsigned(let b)), (.negative(let a), .negative(let b)): a == b
        case (.bytes(let a), .bytes(let b)): a == b
        case (.text(let a), .text(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.map(let a), .map(let b)): a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case (.tagged(let t, let a), .tagged(let u, let b)): t == u && a == b
        case (.simple(let a), .simple(let b)): a == b
        default: false
        }
    }

    /// Why bytes are not one CBOR item.
    public enum DecodingError: Error, Equatable, Sendable {
        case truncated
        case tooDeep
        case unsupported(String)
        case trailingBytes
        case invalidText
    }

    /// Decodes exactly one item filling `bytes`.
    public static func decode(_ bytes: [UInt8], maxDepth: Int = 16) throws(DecodingError) -> CBOR {
        var reader = Reader(bytes: bytes, maxDepth: maxDepth)
        let value = try reader.item(depth: 0)
        guard reader.offset == bytes.count else { throw .trailingBytes }
        return value
    }

    /// The value of `key` in a map with text keys; nil for other items or a missing key.
    public subscript(key: String) -> CBOR? {
        guard case .map(let pairs) = self else { return nil }
        return pairs.first { $0.0 == .text(key) }?.1
    }

    public var byteString: [UInt8]? {
        if case .bytes(let bytes) = self { return bytes }
        return nil
    }

    public var textString: String? {
        if case .text(let text) = self { return text }
        return nil
    }

    public var arrayItems: [CBOR]? {
        if case .array(let items) = self { return items }
        return nil
    }

    struct Reader {
        let bytes: [UInt8]
        let maxDepth: Int
        var offset = 0

        var remaining: Int { bytes.count - offset }

        mutating func byte() throws(DecodingError) -> UInt8 {
            guard offset < bytes.count else { throw .truncated }
            defer { offset += 1 }
            return bytes[offset]
        }

        /// The argument of an initial byte (its additional information and following bytes).
        mutating func argument(_ info: UInt8) throws(DecodingError) -> UInt64 {
            switch info {
            case 0..<24: return UInt64(info)
            case 24, 25, 26, 27:
                let count = 1 << Int(info - 24)
                guard remaining >= count else { throw .truncated }
                var value: UInt64 = 0
                for _ in 0..<count { value = value << 8 | UInt64(try byte()) }
                return value
            case 31: throw .unsupported("indefinite length")
            default: throw .unsupported("reserved additional information \(info)")
            }
        }

        /// A length that the rest of the input can hold (each element takes at least one byte).
        mutating func length(_ info: UInt8, elementSize: Int = 1) throws(DecodingError) -> Int {
            let value = try argument(info)
            guard value <= UInt64(remaining / elementSize) else { throw .truncated }
            return Int(value)
        }

        mutating func item(depth: Int) throws(DecodingError) -> CBOR {
            guard depth <= maxDepth else { throw .tooDeep }
            let initial = try byte()
            let major = initial >> 5, info = initial & 0x1F
            switch major {
            case 0: return .unsigned(try argument(info))
            case 1: return .negative(try argument(info))
            case 2:
                let count = try length(info)
                defer { offset += count }
                return .bytes(Array(bytes[offset..<(offset + count)]))
            case 3:
                let count = try length(info)
                defer { offset += count }
                guard let text = String(validating: bytes[offset..<(offset + count)], as: UTF8.self) else { throw .invalidText }
                return .text(text)
            case 4:
                let count = try length(info)
                var items: [CBOR] = []
                items.reserveCapacity(count)
                for _ in 0..<count { items.append(try item(depth: depth + 1)) }
                return .array(items)
            case 5:
                let count = try length(info, elementSize: 2)
                var pairs: [(CBOR, CBOR)] = []
                pairs.reserveCapacity(count)
                for _ in 0..<count {
                    let key = try item(depth: depth + 1)
                    pairs.append((key, try item(depth: depth + 1)))
                }
                return .map(pairs)
            case 6:
                let tag = try argument(info)
                return .tagged(tag, Box(try item(depth: depth + 1)))
            default:
                switch info {
                case 0..<24: return .simple(info)
                case 24: return .simple(try byte())
                default: throw .unsupported("floating-point or reserved value \(info)")
                }
            }
        }
    }
}
