import Foundation

/// The bus's compact binary form of `Codable` values: self-describing like JSON (field names are
/// kept, so optional and added fields work the same way, and unknown fields are skipped), but
/// written and read in one pass without building a tree, numbers as varints, strings and bytes
/// length-prefixed, and containers prefixed with their size in bytes so a reader skips a field
/// without reading it.
///
/// | tag | value | then |
/// | --- | --- | --- |
/// | 0 | nil | |
/// | 1, 2 | false, true | |
/// | 3 | signed integer | zigzag LEB128 varint |
/// | 4 | unsigned integer | LEB128 varint |
/// | 5 | floating point | 8 bytes, IEEE 754 double, little-endian |
/// | 6 | string | varint byte count, UTF-8 |
/// | 7 | bytes (`Data`) | varint byte count, the bytes |
/// | 8 | array | 4-byte little-endian byte count, the elements |
/// | 9 | keyed container | 4-byte little-endian byte count, then pairs of key (varint byte count, UTF-8) and value |
///
/// `Date` is written as its own `Codable` form (seconds since 2001 as a double), as Foundation's
/// JSON coders do by default.
public enum BinaryCoding {
    /// The deepest nesting of containers a reader accepts; deeper is refused as corrupt.
    public static let maxDepth = 64

    enum Tag: UInt8 {
        case null = 0, `false` = 1, `true` = 2, int = 3, uint = 4, double = 5, string = 6, bytes = 7, array = 8, keyed = 9
    }

    /// Encodes `value`.
    public static func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        try encode(value, direct: true)
    }

    /// Encodes `value`; with `direct` false, the messages written by hand (`BinaryDirectCodable`)
    /// go through their `Codable` form instead, which the tests compare them with.
    static func encode<T: Encodable>(_ value: T, direct: Bool) throws -> [UInt8] {
        let writer = BinaryWriter(direct: direct)
        try writer.encodeValue(value, codingPath: [])
        writer.close(downTo: 0)
        if let error = writer.error { throw error }
        return writer.bytes
    }

    /// Decodes a `T` from `bytes`, which must hold exactly one value.
    public static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
        try decode(type, from: bytes, direct: true)
    }

    /// Decodes a `T`; with `direct` false, as `encode(_:direct:)`.
    static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8], direct: Bool) throws -> T {
        let reader = BinaryReader(bytes, direct: direct)
        let end = try reader.valueEnd(at: 0, limit: bytes.count, codingPath: [])
        guard end == bytes.count else {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "\(bytes.count - end) bytes after the value"))
        }
        return try reader.decodeValue(type, at: 0, limit: end, depth: 0, codingPath: [])
    }
}

// MARK: - Writing

/// The bytes being written and the containers still open (the offsets of their size fields).
/// Containers are written in place: one opened inside another is closed when its parent is
/// written to again, or when the value that opened them ends.
final class BinaryWriter {
    var bytes: [UInt8] = []
    private var open: [Int] = []
    var error: (any Error)?
    /// Whether messages written by hand (`BinaryDirectCodable`) write themselves.
    let direct: Bool

    init(direct: Bool = true) {
        self.direct = direct
        bytes.reserveCapacity(256)
    }

    var depth: Int { open.count }

    /// Makes the container at `depth` the innermost open one, closing those inside it; records an
    /// error if it was closed already (a container written to after a sibling replaced it).
    @inline(__always)
    func prepare(depth: Int, codingPath: [any CodingKey]) {
        if open.count > depth { close(downTo: depth) }
        if open.count < depth, error == nil {
            error = EncodingError.invalidValue((), .init(codingPath: codingPath, debugDescription: "a container was written to after it was closed"))
        }
    }

    func close(downTo depth: Int) {
        while open.count > depth {
            let sizeAt = open.removeLast()
            let size = UInt32(truncatingIfNeeded: bytes.count - sizeAt - 4)
            bytes[sizeAt] = UInt8(truncatingIfNeeded: size)
            bytes[sizeAt + 1] = UInt8(truncatingIfNeeded: size >> 8)
            bytes[sizeAt + 2] = UInt8(truncatingIfNeeded: size >> 16)
            bytes[sizeAt + 3] = UInt8(truncatingIfNeeded: size >> 24)
        }
    }

    func openContainer(_ tag: BinaryCoding.Tag) {
        bytes.append(tag.rawValue)
        open.append(bytes.count)
        bytes.append(contentsOf: [0, 0, 0, 0] as [UInt8])
    }

    /// Whether the innermost open container is at `depth` and keyed (a value asking twice for a
    /// keyed container gets the same one, as with JSON).
    func isKeyedOpen(atDepth depth: Int) -> Bool {
        open.count >= depth && bytes[open[depth - 1] - 1] == BinaryCoding.Tag.keyed.rawValue
    }

    func encodeValue<T: Encodable>(_ value: T, codingPath: @autoclosure () -> [any CodingKey]) throws {
        // The common leaves and string-keyed dictionaries directly, without an encoder and its
        // containers for each.
        if T.self == String.self { return write(value as! String) }
        if T.self == Double.self { return write(value as! Double) }
        if T.self == Int.self { return write(Int64(value as! Int)) }
        if T.self == Bool.self { return write(value as! Bool) }
        if T.self == Data.self { return writeBytes(value as! Data) }
        // As `Date`'s own `Codable` writes it: seconds since 2001 as a double.
        if T.self == Date.self { return write((value as! Date).timeIntervalSinceReferenceDate) }
        if direct, let message = value as? any BinaryDirectCodable { return encodeDirect(message) }
        if let dictionary = value as? any BinaryStringKeyedDictionary {
            return try dictionary.encodeBinary(self, codingPath: codingPath())
        }
        let depth = open.count
        let start = bytes.count
        try value.encode(to: BinaryValueEncoder(writer: self, depth: depth, codingPath: codingPath()))
        close(downTo: depth)
        if bytes.count == start {
            // A value that wrote nothing is an empty keyed container, as in JSON.
            openContainer(.keyed)
            close(downTo: depth)
        }
    }

    @inline(__always) func writeNil() { bytes.append(BinaryCoding.Tag.null.rawValue) }
    @inline(__always) func write(_ value: Bool) { bytes.append(value ? BinaryCoding.Tag.true.rawValue : BinaryCoding.Tag.false.rawValue) }

    @inline(__always) func write(_ value: Int64) {
        bytes.append(BinaryCoding.Tag.int.rawValue)
        writeVarint(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    @inline(__always) func write(_ value: UInt64) {
        bytes.append(BinaryCoding.Tag.uint.rawValue)
        writeVarint(value)
    }

    func write(_ value: Double) {
        bytes.append(BinaryCoding.Tag.double.rawValue)
        let bits = value.bitPattern
        for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: bits >> UInt64(shift))) }
    }

    func write(_ value: String) {
        bytes.append(BinaryCoding.Tag.string.rawValue)
        writeRawString(value)
    }

    func writeBytes(_ data: Data) {
        bytes.append(BinaryCoding.Tag.bytes.rawValue)
        writeVarint(UInt64(data.count))
        bytes.append(contentsOf: data)
    }

    /// A key or string body: varint byte count, then the UTF-8.
    @inline(__always) func writeRawString(_ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            writeVarint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    @inline(__always) func writeVarint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }
}

struct BinaryValueEncoder: Encoder {
    let writer: BinaryWriter
    let depth: Int
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if writer.isKeyedOpen(atDepth: depth + 1) {
            writer.prepare(depth: depth + 1, codingPath: codingPath)
        } else {
            writer.prepare(depth: depth, codingPath: codingPath)
            writer.openContainer(.keyed)
        }
        return KeyedEncodingContainer(BinaryKeyedEncoder<Key>(writer: writer, depth: depth + 1, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        writer.prepare(depth: depth, codingPath: codingPath)
        writer.openContainer(.array)
        return BinaryUnkeyedEncoder(writer: writer, depth: depth + 1, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        BinarySingleValueEncoder(writer: writer, depth: depth, codingPath: codingPath)
    }
}

struct BinaryKeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let writer: BinaryWriter
    let depth: Int
    let codingPath: [any CodingKey]

    @inline(__always) private func key(_ key: Key) {
        writer.prepare(depth: depth, codingPath: codingPath)
        writer.writeRawString(key.stringValue)
    }

    mutating func encodeNil(forKey key: Key) throws { self.key(key); writer.writeNil() }
    mutating func encode(_ value: Bool, forKey key: Key) throws { self.key(key); writer.write(value) }
    mutating func encode(_ value: String, forKey key: Key) throws { self.key(key); writer.write(value) }
    mutating func encode(_ value: Double, forKey key: Key) throws { self.key(key); writer.write(value) }
    mutating func encode(_ value: Float, forKey key: Key) throws { self.key(key); writer.write(Double(value)) }
    mutating func encode(_ value: Int, forKey key: Key) throws { self.key(key); writer.write(Int64(value)) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { self.key(key); writer.write(Int64(value)) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { self.key(key); writer.write(Int64(value)) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { self.key(key); writer.write(Int64(value)) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { self.key(key); writer.write(value) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { self.key(key); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { self.key(key); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { self.key(key); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { self.key(key); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { self.key(key); writer.write(value) }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        self.key(key)
        try writer.encodeValue(value, codingPath: codingPath + [key])
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        self.key(key)
        writer.openContainer(.keyed)
        return KeyedEncodingContainer(BinaryKeyedEncoder<NestedKey>(writer: writer, depth: depth + 1, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        self.key(key)
        writer.openContainer(.array)
        return BinaryUnkeyedEncoder(writer: writer, depth: depth + 1, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder { unsupportedSuperEncoder(writer, codingPath) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { unsupportedSuperEncoder(writer, codingPath) }
}

/// Super encoders hand out an encoder whose lifetime is not scoped, which writing in place
/// cannot follow; no bus message is a subclass. Encoding fails with a clear error.
private func unsupportedSuperEncoder(_ writer: BinaryWriter, _ codingPath: [any CodingKey]) -> any Encoder {
    if writer.error == nil {
        writer.error = EncodingError.invalidValue((), .init(codingPath: codingPath, debugDescription: "super encoders are not supported by the bus's binary coding; use JSON"))
    }
    return BinaryValueEncoder(writer: BinaryWriter(), depth: 0, codingPath: codingPath)
}

struct BinaryUnkeyedEncoder: UnkeyedEncodingContainer {
    let writer: BinaryWriter
    let depth: Int
    let codingPath: [any CodingKey]
    private(set) var count = 0

    init(writer: BinaryWriter, depth: Int, codingPath: [any CodingKey]) {
        self.writer = writer
        self.depth = depth
        self.codingPath = codingPath
    }

    @inline(__always) private mutating func next() {
        writer.prepare(depth: depth, codingPath: codingPath)
        count += 1
    }

    mutating func encodeNil() throws { next(); writer.writeNil() }
    mutating func encode(_ value: Bool) throws { next(); writer.write(value) }
    mutating func encode(_ value: String) throws { next(); writer.write(value) }
    mutating func encode(_ value: Double) throws { next(); writer.write(value) }
    mutating func encode(_ value: Float) throws { next(); writer.write(Double(value)) }
    mutating func encode(_ value: Int) throws { next(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int8) throws { next(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int16) throws { next(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int32) throws { next(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int64) throws { next(); writer.write(value) }
    mutating func encode(_ value: UInt) throws { next(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt8) throws { next(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt16) throws { next(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt32) throws { next(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt64) throws { next(); writer.write(value) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        next()
        try writer.encodeValue(value, codingPath: codingPath + [IndexKey(count - 1)])
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        next()
        writer.openContainer(.keyed)
        return KeyedEncodingContainer(BinaryKeyedEncoder<NestedKey>(writer: writer, depth: depth + 1, codingPath: codingPath + [IndexKey(count - 1)]))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        next()
        writer.openContainer(.array)
        return BinaryUnkeyedEncoder(writer: writer, depth: depth + 1, codingPath: codingPath + [IndexKey(count - 1)])
    }

    mutating func superEncoder() -> any Encoder { unsupportedSuperEncoder(writer, codingPath) }
}

struct BinarySingleValueEncoder: SingleValueEncodingContainer {
    let writer: BinaryWriter
    let depth: Int
    let codingPath: [any CodingKey]

    @inline(__always) private func prepare() { writer.prepare(depth: depth, codingPath: codingPath) }

    mutating func encodeNil() throws { prepare(); writer.writeNil() }
    mutating func encode(_ value: Bool) throws { prepare(); writer.write(value) }
    mutating func encode(_ value: String) throws { prepare(); writer.write(value) }
    mutating func encode(_ value: Double) throws { prepare(); writer.write(value) }
    mutating func encode(_ value: Float) throws { prepare(); writer.write(Double(value)) }
    mutating func encode(_ value: Int) throws { prepare(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int8) throws { prepare(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int16) throws { prepare(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int32) throws { prepare(); writer.write(Int64(value)) }
    mutating func encode(_ value: Int64) throws { prepare(); writer.write(value) }
    mutating func encode(_ value: UInt) throws { prepare(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt8) throws { prepare(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt16) throws { prepare(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt32) throws { prepare(); writer.write(UInt64(value)) }
    mutating func encode(_ value: UInt64) throws { prepare(); writer.write(value) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        prepare()
        try writer.encodeValue(value, codingPath: codingPath)
    }
}

/// An array index as a coding key, for error paths.
struct IndexKey: CodingKey {
    let intValue: Int?
    var stringValue: String { "\(intValue ?? 0)" }
    init(_ index: Int) { intValue = index }
    init?(stringValue: String) { return nil }
    init?(intValue: Int) { self.intValue = intValue }
}

/// `[String: Value]`, written and read as a keyed container without a coding key per entry.
protocol BinaryStringKeyedDictionary {
    func encodeBinary(_ writer: BinaryWriter, codingPath: [any CodingKey]) throws
    static func decodeBinary(_ reader: BinaryReader, at offset: Int, limit: Int, depth: Int, codingPath: [any CodingKey]) throws -> Self
}

extension Dictionary: BinaryStringKeyedDictionary where Key == String, Value: Codable {
    func encodeBinary(_ writer: BinaryWriter, codingPath: [any CodingKey]) throws {
        let depth = writer.depth
        writer.openContainer(.keyed)
        for (key, value) in self {
            writer.prepare(depth: depth + 1, codingPath: codingPath)
            writer.writeRawString(key)
            try writer.encodeValue(value, codingPath: codingPath + [DictionaryKey(key)])
        }
        writer.close(downTo: depth)
    }

    static func decodeBinary(_ reader: BinaryReader, at offset: Int, limit: Int, depth: Int, codingPath: [any CodingKey]) throws -> Self {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw reader.typeMismatch(Self.self, tag, codingPath) }
        guard depth < BinaryCoding.maxDepth else { throw reader.corrupt(codingPath, "nested deeper than \(BinaryCoding.maxDepth)") }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        var result: Self = [:]
        var position = body.lowerBound
        while position < body.upperBound {
            let keyRange = try reader.run(at: position, limit: body.upperBound, codingPath: codingPath)
            guard let key = utf8String(reader.bytes, keyRange) else { throw reader.corrupt(codingPath, "key is not UTF-8") }
            let end = try reader.valueEnd(at: keyRange.upperBound, limit: body.upperBound, codingPath: codingPath)
            result[key] = try reader.decodeValue(Value.self, at: keyRange.upperBound, limit: end, depth: depth + 1, codingPath: codingPath + [DictionaryKey(key)])
            position = end
        }
        return result
    }
}

/// A dictionary's key as a coding key, for error paths.
struct DictionaryKey: CodingKey {
    let stringValue: String
    var intValue: Int? { nil }
    init(_ key: String) { stringValue = key }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { return nil }
}

// MARK: - Reading

/// Reads values in place from the bytes; every offset and length is checked against the end of
/// the enclosing value, so garbage gives a `DecodingError`, never a trap.
final class BinaryReader {
    let bytes: [UInt8]
    /// Whether messages written by hand (`BinaryDirectCodable`) read themselves.
    let direct: Bool

    init(_ bytes: [UInt8], direct: Bool = true) {
        self.bytes = bytes
        self.direct = direct
    }

    func corrupt(_ codingPath: [any CodingKey], _ description: String) -> DecodingError {
        .dataCorrupted(.init(codingPath: codingPath, debugDescription: description))
    }

    @inline(__always) func tag(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> BinaryCoding.Tag {
        guard offset < limit else { throw corrupt(codingPath(), "value missing at the end of its container") }
        guard let tag = BinaryCoding.Tag(rawValue: bytes[offset]) else { throw corrupt(codingPath(), "unknown value tag \(bytes[offset])") }
        return tag
    }

    /// Reads a varint at `offset`; the value and the offset after it.
    @inline(__always) func varint(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> (UInt64, Int) {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        var index = offset
        while true {
            guard index < limit, shift < 64 else { throw corrupt(codingPath(), "truncated or overlong integer") }
            let byte = bytes[index]
            value |= UInt64(byte & 0x7F) << shift
            index += 1
            if byte < 0x80 { return (value, index) }
            shift += 7
        }
    }

    /// A length-prefixed run (string, bytes, key) at `offset`: where its bytes start and end.
    @inline(__always) func run(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Range<Int> {
        let (count, start) = try varint(at: offset, limit: limit, codingPath: codingPath())
        guard count <= UInt64(limit - start) else { throw corrupt(codingPath(), "length \(count) runs past the end") }
        return start..<(start + Int(count))
    }

    /// The contents of the container whose tag is at `offset`.
    @inline(__always) func containerBody(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Range<Int> {
        guard limit - offset >= 5 else { throw corrupt(codingPath(), "truncated container") }
        let size = Int(bytes[offset + 1]) | Int(bytes[offset + 2]) << 8 | Int(bytes[offset + 3]) << 16 | Int(bytes[offset + 4]) << 24
        guard size <= limit - offset - 5 else { throw corrupt(codingPath(), "container size \(size) runs past the end") }
        return (offset + 5)..<(offset + 5 + size)
    }

    /// Where the value at `offset` ends, without reading inside containers.
    func valueEnd(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Int {
        switch try tag(at: offset, limit: limit, codingPath: codingPath()) {
        case .null, .false, .true: return offset + 1
        case .int, .uint: return try varint(at: offset + 1, limit: limit, codingPath: codingPath()).1
        case .double:
            guard limit - offset >= 9 else { throw corrupt(codingPath(), "truncated number") }
            return offset + 9
        case .string, .bytes: return try run(at: offset + 1, limit: limit, codingPath: codingPath()).upperBound
        case .array, .keyed: return try containerBody(at: offset, limit: limit, codingPath: codingPath()).upperBound
        }
    }

    func typeMismatch<T>(_ type: T.Type, _ tag: BinaryCoding.Tag, _ codingPath: @autoclosure () -> [any CodingKey]) -> DecodingError {
        .typeMismatch(type, .init(codingPath: codingPath(), debugDescription: "expected \(type), found \(tag.description)"))
    }

    func decodeNil(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Bool {
        try tag(at: offset, limit: limit, codingPath: codingPath()) == .null
    }

    func decodeBool(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Bool {
        switch try tag(at: offset, limit: limit, codingPath: codingPath()) {
        case .true: return true
        case .false: return false
        case let other: throw typeMismatch(Bool.self, other, codingPath())
        }
    }

    func decodeString(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> String {
        let tag = try tag(at: offset, limit: limit, codingPath: codingPath())
        guard tag == .string else { throw typeMismatch(String.self, tag, codingPath()) }
        let range = try run(at: offset + 1, limit: limit, codingPath: codingPath())
        guard let string = utf8String(bytes, range) else { throw corrupt(codingPath(), "string is not UTF-8") }
        return string
    }

    func decodeData(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Data {
        let tag = try tag(at: offset, limit: limit, codingPath: codingPath())
        guard tag == .bytes else { throw typeMismatch(Data.self, tag, codingPath()) }
        return Data(bytes[try run(at: offset + 1, limit: limit, codingPath: codingPath())])
    }

    func decodeDouble(at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> Double {
        switch try tag(at: offset, limit: limit, codingPath: codingPath()) {
        case .double:
            guard limit - offset >= 9 else { throw corrupt(codingPath(), "truncated number") }
            var bits: UInt64 = 0
            for index in 0..<8 { bits |= UInt64(bytes[offset + 1 + index]) << UInt64(index * 8) }
            return Double(bitPattern: bits)
        case .int: return Double(try decodeInteger(Int64.self, at: offset, limit: limit, codingPath: codingPath()))
        case .uint: return Double(try decodeInteger(UInt64.self, at: offset, limit: limit, codingPath: codingPath()))
        case let other: throw typeMismatch(Double.self, other, codingPath())
        }
    }

    func decodeInteger<T: FixedWidthInteger>(_ type: T.Type, at offset: Int, limit: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> T {
        let tag = try tag(at: offset, limit: limit, codingPath: codingPath())
        let (raw, _) = try varint(at: offset + 1, limit: limit, codingPath: codingPath())
        let value: T?
        switch tag {
        case .int:
            let signed = Int64(bitPattern: (raw >> 1) ^ (0 &- (raw & 1)))
            value = T(exactly: signed)
        case .uint:
            value = T(exactly: raw)
        default:
            throw typeMismatch(type, tag, codingPath())
        }
        guard let value else { throw corrupt(codingPath(), "number does not fit in \(type)") }
        return value
    }

    func decodeValue<T: Decodable>(_ type: T.Type, at offset: Int, limit: Int, depth: Int, codingPath: @autoclosure () -> [any CodingKey]) throws -> T {
        // The common leaves and string-keyed dictionaries directly, without a decoder and its
        // containers for each.
        if T.self == String.self { return try decodeString(at: offset, limit: limit, codingPath: codingPath()) as! T }
        if T.self == Double.self { return try decodeDouble(at: offset, limit: limit, codingPath: codingPath()) as! T }
        if T.self == Int.self { return try decodeInteger(Int.self, at: offset, limit: limit, codingPath: codingPath()) as! T }
        if T.self == Bool.self { return try decodeBool(at: offset, limit: limit, codingPath: codingPath()) as! T }
        if T.self == Data.self { return try decodeData(at: offset, limit: limit, codingPath: codingPath()) as! T }
        if T.self == Date.self {
            return Date(timeIntervalSinceReferenceDate: try decodeDouble(at: offset, limit: limit, codingPath: codingPath())) as! T
        }
        if direct, let message = T.self as? any BinaryDirectCodable.Type {
            return try decodeDirect(message, at: offset, limit: limit, depth: depth, codingPath: codingPath()) as! T
        }
        if let dictionary = T.self as? any BinaryStringKeyedDictionary.Type {
            return try dictionary.decodeBinary(self, at: offset, limit: limit, depth: depth, codingPath: codingPath()) as! T
        }
        guard depth < BinaryCoding.maxDepth else { throw corrupt(codingPath(), "nested deeper than \(BinaryCoding.maxDepth)") }
        return try T(from: BinaryValueDecoder(reader: self, offset: offset, limit: limit, depth: depth, codingPath: codingPath()))
    }
}

extension BinaryCoding.Tag: CustomStringConvertible {
    var description: String {
        switch self {
        case .null: "nil"
        case .false, .true: "a boolean"
        case .int, .uint: "an integer"
        case .double: "a floating-point number"
        case .string: "a string"
        case .bytes: "bytes"
        case .array: "an array"
        case .keyed: "a keyed container"
        }
    }
}

struct BinaryValueDecoder: Decoder {
    let reader: BinaryReader
    let offset: Int
    let limit: Int
    let depth: Int
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw reader.typeMismatch([String: Any].self, tag, codingPath) }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        return KeyedDecodingContainer(try BinaryKeyedDecoder<Key>(reader: reader, body: body, depth: depth + 1, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .array else { throw reader.typeMismatch([Any].self, tag, codingPath) }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        return try BinaryUnkeyedDecoder(reader: reader, body: body, depth: depth + 1, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        BinarySingleValueDecoder(reader: reader, offset: offset, limit: limit, depth: depth, codingPath: codingPath)
    }
}

final class BinaryKeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    private struct Entry {
        var key: Range<Int>
        var value: Int
        var end: Int
    }

    let reader: BinaryReader
    let depth: Int
    let codingPath: [any CodingKey]
    private let entries: [Entry]
    /// The entry found last: fields are usually read in the order they were written, so the one
    /// after it is tried first.
    private var last = -1

    init(reader: BinaryReader, body: Range<Int>, depth: Int, codingPath: [any CodingKey]) throws {
        self.reader = reader
        self.depth = depth
        self.codingPath = codingPath
        var entries: [Entry] = []
        var offset = body.lowerBound
        while offset < body.upperBound {
            let key = try reader.run(at: offset, limit: body.upperBound, codingPath: codingPath)
            let end = try reader.valueEnd(at: key.upperBound, limit: body.upperBound, codingPath: codingPath)
            entries.append(Entry(key: key, value: key.upperBound, end: end))
            offset = end
        }
        self.entries = entries
    }

    var allKeys: [Key] {
        entries.compactMap { entry in utf8String(reader.bytes, entry.key).flatMap(Key.init(stringValue:)) }
    }

    @inline(__always) private func matches(_ index: Int, _ key: inout String) -> Bool {
        let range = entries[index].key
        return key.withUTF8 { utf8 in
            utf8.count == range.count && reader.bytes.withUnsafeBufferPointer { bytes in
                utf8.count == 0 || memcmp(bytes.baseAddress! + range.lowerBound, utf8.baseAddress!, utf8.count) == 0
            }
        }
    }

    private func find(_ key: Key) -> Entry? {
        var name = key.stringValue
        if last >= 0, matches(last, &name) { return entries[last] }
        if last + 1 < entries.count, matches(last + 1, &name) {
            last += 1
            return entries[last]
        }
        for index in entries.indices where matches(index, &name) {
            last = index
            return entries[index]
        }
        return nil
    }

    private func entry(_ key: Key) throws -> Entry {
        guard let entry = find(key) else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for '\(key.stringValue)'"))
        }
        return entry
    }

    func contains(_ key: Key) -> Bool { find(key) != nil }

    func decodeNil(forKey key: Key) throws -> Bool {
        let entry = try entry(key)
        return try reader.decodeNil(at: entry.value, limit: entry.end, codingPath: codingPath + [key])
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool {
        let entry = try entry(key)
        return try reader.decodeBool(at: entry.value, limit: entry.end, codingPath: codingPath + [key])
    }

    func decode(_ type: String.Type, forKey key: Key) throws -> String {
        let entry = try entry(key)
        return try reader.decodeString(at: entry.value, limit: entry.end, codingPath: codingPath + [key])
    }

    func decode(_ type: Double.Type, forKey key: Key) throws -> Double {
        let entry = try entry(key)
        return try reader.decodeDouble(at: entry.value, limit: entry.end, codingPath: codingPath + [key])
    }

    func decode(_ type: Float.Type, forKey key: Key) throws -> Float {
        let entry = try entry(key)
        return Float(try reader.decodeDouble(at: entry.value, limit: entry.end, codingPath: codingPath + [key]))
    }

    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try integer(key) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try integer(key) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try integer(key) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try integer(key) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try integer(key) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try integer(key) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try integer(key) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try integer(key) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try integer(key) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try integer(key) }

    private func integer<T: FixedWidthInteger>(_ key: Key) throws -> T {
        let entry = try entry(key)
        return try reader.decodeInteger(T.self, at: entry.value, limit: entry.end, codingPath: codingPath + [key])
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let entry = try entry(key)
        return try reader.decodeValue(type, at: entry.value, limit: entry.end, depth: depth, codingPath: codingPath + [key])
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        let entry = try entry(key)
        return try BinaryValueDecoder(reader: reader, offset: entry.value, limit: entry.end, depth: depth, codingPath: codingPath + [key])
            .container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        let entry = try entry(key)
        return try BinaryValueDecoder(reader: reader, offset: entry.value, limit: entry.end, depth: depth, codingPath: codingPath + [key])
            .unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder {
        throw reader.corrupt(codingPath, "super decoders are not supported by the bus's binary coding")
    }

    func superDecoder(forKey key: Key) throws -> any Decoder { try superDecoder() }
}

struct BinaryUnkeyedDecoder: UnkeyedDecodingContainer {
    let reader: BinaryReader
    let depth: Int
    let codingPath: [any CodingKey]
    private let end: Int
    private var offset: Int
    let count: Int?
    private(set) var currentIndex = 0

    init(reader: BinaryReader, body: Range<Int>, depth: Int, codingPath: [any CodingKey]) throws {
        self.reader = reader
        self.depth = depth
        self.codingPath = codingPath
        self.end = body.upperBound
        self.offset = body.lowerBound
        var count = 0
        var scan = body.lowerBound
        while scan < body.upperBound {
            scan = try reader.valueEnd(at: scan, limit: body.upperBound, codingPath: codingPath)
            count += 1
        }
        self.count = count
    }

    var isAtEnd: Bool { offset >= end }

    private var path: [any CodingKey] { codingPath + [IndexKey(currentIndex)] }

    /// The next element's offset and end; moves past it.
    private mutating func next() throws -> (Int, Int) {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(Any.self, .init(codingPath: path, debugDescription: "no more elements"))
        }
        let start = offset
        let valueEnd = try reader.valueEnd(at: start, limit: end, codingPath: path)
        offset = valueEnd
        currentIndex += 1
        return (start, valueEnd)
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd else { return false }
        if try reader.decodeNil(at: offset, limit: end, codingPath: path) {
            _ = try next()
            return true
        }
        return false
    }

    mutating func decode(_ type: Bool.Type) throws -> Bool {
        let index = currentIndex
        let (start, limit) = try next()
        return try reader.decodeBool(at: start, limit: limit, codingPath: codingPath + [IndexKey(index)])
    }

    mutating func decode(_ type: String.Type) throws -> String {
        let index = currentIndex
        let (start, limit) = try next()
        return try reader.decodeString(at: start, limit: limit, codingPath: codingPath + [IndexKey(index)])
    }

    mutating func decode(_ type: Double.Type) throws -> Double {
        let index = currentIndex
        let (start, limit) = try next()
        return try reader.decodeDouble(at: start, limit: limit, codingPath: codingPath + [IndexKey(index)])
    }

    mutating func decode(_ type: Float.Type) throws -> Float { Float(try decode(Double.self)) }
    mutating func decode(_ type: Int.Type) throws -> Int { try integer() }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try integer() }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try integer() }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try integer() }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try integer() }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try integer() }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try integer() }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try integer() }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try integer() }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try integer() }

    private mutating func integer<T: FixedWidthInteger>() throws -> T {
        let index = currentIndex
        let (start, limit) = try next()
        return try reader.decodeInteger(T.self, at: start, limit: limit, codingPath: codingPath + [IndexKey(index)])
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let index = currentIndex
        let (start, limit) = try next()
        return try reader.decodeValue(type, at: start, limit: limit, depth: depth, codingPath: codingPath + [IndexKey(index)])
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        let index = currentIndex
        let (start, limit) = try next()
        return try BinaryValueDecoder(reader: reader, offset: start, limit: limit, depth: depth, codingPath: codingPath + [IndexKey(index)]).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let index = currentIndex
        let (start, limit) = try next()
        return try BinaryValueDecoder(reader: reader, offset: start, limit: limit, depth: depth, codingPath: codingPath + [IndexKey(index)]).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder {
        throw reader.corrupt(codingPath, "super decoders are not supported by the bus's binary coding")
    }
}

struct BinarySingleValueDecoder: SingleValueDecodingContainer {
    let reader: BinaryReader
    let offset: Int
    let limit: Int
    let depth: Int
    let codingPath: [any CodingKey]

    func decodeNil() -> Bool { (try? reader.decodeNil(at: offset, limit: limit, codingPath: codingPath)) ?? false }
    func decode(_ type: Bool.Type) throws -> Bool { try reader.decodeBool(at: offset, limit: limit, codingPath: codingPath) }
    func decode(_ type: String.Type) throws -> String { try reader.decodeString(at: offset, limit: limit, codingPath: codingPath) }
    func decode(_ type: Double.Type) throws -> Double { try reader.decodeDouble(at: offset, limit: limit, codingPath: codingPath) }
    func decode(_ type: Float.Type) throws -> Float { Float(try decode(Double.self)) }
    func decode(_ type: Int.Type) throws -> Int { try integer() }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer() }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer() }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer() }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer() }
    func decode(_ type: UInt.Type) throws -> UInt { try integer() }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer() }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer() }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer() }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer() }

    private func integer<T: FixedWidthInteger>() throws -> T {
        try reader.decodeInteger(T.self, at: offset, limit: limit, codingPath: codingPath)
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try reader.decodeValue(type, at: offset, limit: limit, depth: depth, codingPath: codingPath)
    }
}

// MARK: - UTF-8

/// The string of `bytes`, or nil when they are not UTF-8. `String(validating:as:)` is generic over
/// its sequence and looked up type metadata on every call (2% of the machine decoding history
/// pages, perf); `String(decoding:as:)` of a buffer is specialised but repairs what is not
/// UTF-8, so a string that is not its bytes again was repaired, and is refused.
func utf8String(_ bytes: UnsafeBufferPointer<UInt8>) -> String? {
    guard let base = bytes.baseAddress, !bytes.isEmpty else { return "" }
    var string = String(decoding: bytes, as: UTF8.self)
    let same = string.withUTF8 { utf8 in utf8.count == bytes.count && memcmp(utf8.baseAddress!, base, bytes.count) == 0 }
    return same ? string : nil
}

/// The string of `bytes[range]`, or nil when they are not UTF-8.
public func utf8String(_ bytes: [UInt8], _ range: Range<Int>) -> String? {
    bytes.withUnsafeBufferPointer { buffer in utf8String(UnsafeBufferPointer(rebasing: buffer[range])) }
}
