import Foundation

/// A message that writes and reads its `BinaryCoding` form itself, in exactly the bytes its
/// `Codable` form gives (its fields' names in declaration order, an absent optional left out; read
/// in any order, unknown fields skipped), so a peer may use either path and the tests hold the two
/// to the same bytes and values.
///
/// Nobody writes a conformance by hand: `@BinaryMessage` (`BinaryMessage.swift`) generates it from
/// the type's declaration, so a field is declared once.
///
/// Why at all: Codable's generic containers look up type metadata for every container and every
/// value (`_swift_getGenericMetadata`, `KeyedDecodingContainer`'s box), which was most of the cost
/// of decoding a `QuotaStatus` in the gateway's `users/me` (perf: 6-7% of the machine, the largest
/// share of the gateway's own code). Only the messages every request carries are marked
/// (docs/bus.md); the rest stay plain `Codable`.
public protocol BinaryDirectCodable: Codable {
    func writeBinary(_ fields: inout BinaryFieldWriter)
    init(binary fields: BinaryFieldReader) throws
}

/// An enum with `String` raw values that a message's field holds: written and read as its raw
/// value directly (as its synthesized `Codable` writes it), not through a `Codable` container.
public protocol BinaryStringEnum: RawRepresentable, Codable where RawValue == String {}

// MARK: - Writing

/// Writes one keyed container's fields: a name, then its value as `BinaryWriter` writes it. The
/// overloads pick the direct path by the field's type; any other `Encodable` goes through its
/// `Codable` form, in the same bytes.
public struct BinaryFieldWriter {
    let writer: BinaryWriter

    /// A field's name. Every value written after one closes the containers it opened (as
    /// `encodeValue` and `encodeDirect` do), so the container is still the innermost open one.
    @inline(__always) private func key(_ name: StaticString) {
        writer.writeVarint(UInt64(name.utf8CodeUnitCount))
        writer.bytes.append(contentsOf: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
    }

    public mutating func write(_ name: StaticString, _ value: String) { key(name); writer.write(value) }
    public mutating func write(_ name: StaticString, _ value: Int) { key(name); writer.write(Int64(value)) }
    public mutating func write(_ name: StaticString, _ value: Bool) { key(name); writer.write(value) }
    public mutating func write(_ name: StaticString, _ value: Double) { key(name); writer.write(value) }
    /// As `Date`'s own `Codable` writes it: seconds since 2001 as a double.
    public mutating func write(_ name: StaticString, _ value: Date) { key(name); writer.write(value.timeIntervalSinceReferenceDate) }
    /// As its synthesized `Codable` writes it: the raw value.
    public mutating func write<T: BinaryStringEnum>(_ name: StaticString, _ value: T) { write(name, value.rawValue) }

    // Optionals as `encodeIfPresent` writes them: nothing when nil.
    public mutating func write(_ name: StaticString, _ value: String?) { if let value { write(name, value) } }
    public mutating func write(_ name: StaticString, _ value: Int?) { if let value { write(name, value) } }
    public mutating func write(_ name: StaticString, _ value: Bool?) { if let value { write(name, value) } }
    public mutating func write(_ name: StaticString, _ value: Double?) { if let value { write(name, value) } }
    public mutating func write(_ name: StaticString, _ value: Date?) { if let value { write(name, value) } }
    public mutating func write<T: BinaryStringEnum>(_ name: StaticString, _ value: T?) { if let value { write(name, value) } }

    public mutating func write(_ name: StaticString, _ values: [String]) {
        let depth = openArray(name)
        for value in values { writer.write(value) }
        writer.close(downTo: depth)
    }

    public mutating func write(_ name: StaticString, _ values: [Int]) {
        let depth = openArray(name)
        for value in values { writer.write(Int64(value)) }
        writer.close(downTo: depth)
    }

    /// A dictionary of numbers (an effect's parameters), as its `Codable` form writes it: a keyed
    /// container of its keys, in the dictionary's order. (Through `Codable`, an empty one cost a
    /// generic container and metadata lookups in every job's messages.)
    public mutating func write(_ name: StaticString, _ values: [String: Double]) {
        key(name)
        let depth = writer.depth
        writer.openContainer(.keyed)
        for (key, value) in values {
            writer.writeVarint(UInt64(key.utf8.count))
            writer.bytes.append(contentsOf: key.utf8)
            writer.write(value)
        }
        writer.close(downTo: depth)
    }

    public mutating func write(_ name: StaticString, _ values: [String: Double]?) { if let values { write(name, values) } }

    public mutating func write<T: BinaryStringEnum>(_ name: StaticString, _ values: [T]) {
        let depth = openArray(name)
        for value in values { writer.write(value.rawValue) }
        writer.close(downTo: depth)
    }

    public mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ values: [T]) {
        let depth = openArray(name)
        for value in values { writer.encodeDirect(value) }
        writer.close(downTo: depth)
    }

    public mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ value: T) {
        key(name)
        writer.encodeDirect(value)
    }

    public mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ value: T?) { if let value { write(name, value) } }
    public mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ values: [T]?) { if let values { write(name, values) } }

    /// Any other value, through its `Codable` form.
    public mutating func write<T: Encodable>(_ name: StaticString, _ value: T) {
        key(name)
        do {
            try writer.encodeValue(value, codingPath: [DictionaryKey("\(name)")])
        } catch {
            if writer.error == nil { writer.error = error }
        }
    }

    /// Any other optional value, through its `Codable` form; nothing when nil.
    public mutating func write<T: Encodable>(_ name: StaticString, _ value: T?) { if let value { write(name, value) } }

    /// A keyed container of the fields `body` writes: an enum case and its associated values, as
    /// Swift's synthesized `Codable` writes them (`{"case": {"_0": value, "label": value}}`, and
    /// an empty container for a case without values).
    public mutating func nested(_ name: StaticString, _ body: (inout BinaryFieldWriter) -> Void = { _ in }) {
        key(name)
        let depth = writer.depth
        writer.openContainer(.keyed)
        var fields = BinaryFieldWriter(writer: writer)
        body(&fields)
        writer.close(downTo: depth)
    }

    /// Writes `name` and opens an array; the depth to close it down to.
    private mutating func openArray(_ name: StaticString) -> Int {
        key(name)
        let depth = writer.depth
        writer.openContainer(.array)
        return depth
    }
}

extension BinaryWriter {
    /// Writes `value`'s keyed container through its own `writeBinary`.
    func encodeDirect<T: BinaryDirectCodable>(_ value: T) {
        let depth = self.depth
        openContainer(.keyed)
        var fields = BinaryFieldWriter(writer: self)
        value.writeBinary(&fields)
        close(downTo: depth)
    }
}

// MARK: - Reading

/// The fields of one keyed container, read in the order they were written.
public struct BinaryFieldReader {
    let reader: BinaryReader
    let body: Range<Int>
    /// The depth of the values inside (the container's own plus one), as `BinaryKeyedDecoder`'s.
    let depth: Int
    /// The path to the container, for errors: the whole path for a message read at the top or
    /// under a `Codable` value; empty for one nested in a message read by hand, whose enclosing
    /// reads put their part of the path in front of an error as it passes (`withPath`), so that
    /// no path is built unless one is thrown.
    let codingPath: [any CodingKey]

    /// Calls `read` with each field's name and value; a name the message does not know is for the
    /// caller to skip (a field added by a newer peer).
    @inline(__always) public func forEach(_ read: (BinaryFieldName, BinaryFieldValue) throws -> Void) throws {
        var position = body.lowerBound
        while position < body.upperBound {
            let name = try reader.run(at: position, limit: body.upperBound, codingPath: codingPath)
            let end = try reader.valueEnd(at: name.upperBound, limit: body.upperBound, codingPath: codingPath)
            try reader.bytes.withUnsafeBytes { bytes in
                try read(BinaryFieldName(bytes: UnsafeRawBufferPointer(rebasing: bytes[name])), BinaryFieldValue(fields: self, name: name, offset: name.upperBound, limit: end))
            }
            position = end
        }
    }

    /// `value`, or the error `Codable` gives for a field that is not there.
    public func required<T>(_ value: T?, _ name: StaticString) throws -> T {
        guard let value else {
            let key = DictionaryKey("\(name)")
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for '\(key.stringValue)'"))
        }
        return value
    }
}

/// A field's name, matched against the message's names in a `switch` (`case "userId":`).
public struct BinaryFieldName {
    let bytes: UnsafeRawBufferPointer

    @inline(__always) public static func ~= (pattern: StaticString, name: BinaryFieldName) -> Bool {
        pattern.utf8CodeUnitCount == name.bytes.count
            && (name.bytes.isEmpty || memcmp(pattern.utf8Start, name.bytes.baseAddress!, name.bytes.count) == 0)
    }
}

/// One field's value, read as the message's type for it (`decode(T.self)`, `optional(T.self)`):
/// the overloads pick the direct path by the type, and any other `Decodable` goes through its
/// `Codable` form. A value of another type is the same `DecodingError` the `Codable` path gives.
public struct BinaryFieldValue {
    let fields: BinaryFieldReader
    /// Where the field's name is in the bytes.
    let name: Range<Int>
    let offset: Int
    let limit: Int

    private var reader: BinaryReader { fields.reader }

    /// The field's path, for errors only.
    var codingPath: [any CodingKey] { fields.codingPath + [DictionaryKey(String(decoding: reader.bytes[name], as: UTF8.self))] }

    /// Whether the value is nil: `decodeIfPresent` reads it as a missing field.
    public var isNil: Bool { reader.bytes[offset] == BinaryCoding.Tag.null.rawValue }

    public func decode(_ type: String.Type) throws -> String { try reader.decodeString(at: offset, limit: limit, codingPath: codingPath) }
    public func decode(_ type: Int.Type) throws -> Int { try reader.decodeInteger(Int.self, at: offset, limit: limit, codingPath: codingPath) }
    public func decode(_ type: Bool.Type) throws -> Bool { try reader.decodeBool(at: offset, limit: limit, codingPath: codingPath) }
    public func decode(_ type: Double.Type) throws -> Double { try reader.decodeDouble(at: offset, limit: limit, codingPath: codingPath) }
    public func decode(_ type: Date.Type) throws -> Date {
        Date(timeIntervalSinceReferenceDate: try reader.decodeDouble(at: offset, limit: limit, codingPath: codingPath))
    }

    /// An enum with `String` raw values, from its raw value.
    public func decode<T: BinaryStringEnum>(_ type: T.Type) throws -> T { try value(T.self, of: decode(String.self)) }

    public func decode(_ type: [String].Type) throws -> [String] {
        var strings: [String] = []
        try forEachElement { offset, end in strings.append(try reader.decodeString(at: offset, limit: end, codingPath: codingPath)) }
        return strings
    }

    public func decode(_ type: [Int].Type) throws -> [Int] {
        var values: [Int] = []
        try forEachElement { offset, end in values.append(try reader.decodeInteger(Int.self, at: offset, limit: end, codingPath: codingPath)) }
        return values
    }

    public func decode<T: BinaryStringEnum>(_ type: [T].Type) throws -> [T] {
        try decode([String].self).map { text in try value(T.self, of: text) }
    }

    /// A dictionary of numbers, from its keyed container (a key sent twice: the last one).
    public func decode(_ type: [String: Double].Type) throws -> [String: Double] {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw reader.typeMismatch(type, tag, codingPath) }
        guard fields.depth < BinaryCoding.maxDepth else { throw reader.corrupt(codingPath, "nested deeper than \(BinaryCoding.maxDepth)") }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        let entries = BinaryFieldReader(reader: reader, body: body, depth: fields.depth + 1, codingPath: codingPath)
        var values: [String: Double] = [:]
        try entries.forEach { name, value in values[String(decoding: name.bytes, as: UTF8.self)] = try value.decode(Double.self) }
        return values
    }

    public func optional(_ type: [String: Double].Type) throws -> [String: Double]? { isNil ? nil : try decode(type) }

    /// A nested message.
    public func decode<T: BinaryDirectCodable>(_ type: T.Type) throws -> T {
        try withPath(codingPath) { try reader.decodeDirect(type, at: offset, limit: limit, depth: fields.depth, codingPath: []) }
    }

    public func decode<T: BinaryDirectCodable>(_ type: [T].Type) throws -> [T] {
        var values: [T] = []
        var index = 0
        try forEachElement { offset, end in
            values.append(try withPath(codingPath + [IndexKey(index)]) {
                try reader.decodeDirect(T.self, at: offset, limit: end, depth: fields.depth + 1, codingPath: [])
            })
            index += 1
        }
        return values
    }

    /// Any other value, through its `Codable` form.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try reader.decodeValue(type, at: offset, limit: limit, depth: fields.depth, codingPath: codingPath)
    }

    // Optionals as `decodeIfPresent` reads them: nil for a nil value as for a missing field.
    public func optional(_ type: String.Type) throws -> String? { isNil ? nil : try decode(type) }
    public func optional(_ type: Int.Type) throws -> Int? { isNil ? nil : try decode(type) }
    public func optional(_ type: Bool.Type) throws -> Bool? { isNil ? nil : try decode(type) }
    public func optional(_ type: Double.Type) throws -> Double? { isNil ? nil : try decode(type) }
    public func optional(_ type: Date.Type) throws -> Date? { isNil ? nil : try decode(type) }
    public func optional<T: BinaryStringEnum>(_ type: T.Type) throws -> T? { isNil ? nil : try decode(type) }
    public func optional(_ type: [String].Type) throws -> [String]? { isNil ? nil : try decode(type) }
    public func optional<T: BinaryStringEnum>(_ type: [T].Type) throws -> [T]? { isNil ? nil : try decode(type) }
    public func optional<T: BinaryDirectCodable>(_ type: T.Type) throws -> T? { isNil ? nil : try decode(type) }
    public func optional<T: BinaryDirectCodable>(_ type: [T].Type) throws -> [T]? { isNil ? nil : try decode(type) }
    public func optional<T: Decodable>(_ type: T.Type) throws -> T? { isNil ? nil : try decode(type) }

    /// `read` with the fields of a keyed container: an enum case's associated values (none, for
    /// a case without; fields a newer peer added are skipped).
    public func keyed<T>(_ read: (BinaryFieldReader) throws -> T) throws -> T {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw reader.typeMismatch([String: Any].self, tag, codingPath) }
        guard fields.depth < BinaryCoding.maxDepth else { throw reader.corrupt(codingPath, "nested deeper than \(BinaryCoding.maxDepth)") }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        return try withPath(codingPath) { try read(BinaryFieldReader(reader: reader, body: body, depth: fields.depth + 1, codingPath: [])) }
    }

    /// The case of `text`, or the error `Codable` gives for a raw value no case has.
    private func value<T: RawRepresentable>(_ type: T.Type, of text: String) throws -> T where T.RawValue == String {
        guard let value = T(rawValue: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "Cannot initialize \(T.self) from invalid String value \(text)"))
        }
        return value
    }

    private func forEachElement(_ read: (Int, Int) throws -> Void) throws {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .array else { throw reader.typeMismatch([Any].self, tag, codingPath) }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        var position = body.lowerBound
        while position < body.upperBound {
            let end = try reader.valueEnd(at: position, limit: body.upperBound, codingPath: codingPath)
            try read(position, end)
            position = end
        }
    }
}

/// An enum's case, as its synthesized `Codable` reads it: exactly one key of a known case
/// (unknown keys are not its cases, and are left out), or a type mismatch.
public struct BinaryEnumCase<Value> {
    var value: Value?
    var count = 0

    public init() {}

    public mutating func found(_ value: Value) {
        self.value = value
        count += 1
    }

    public func value(of type: Any.Type, _ fields: BinaryFieldReader) throws -> Value {
        guard count == 1, let value else {
            throw DecodingError.typeMismatch(type, .init(codingPath: fields.codingPath, debugDescription: "Invalid number of keys found, expected one."))
        }
        return value
    }
}

/// `body`, with `prefix` (evaluated only then) put in front of the path of a `DecodingError` it
/// throws: how a nested read's error gets its whole path without any path being built for the
/// reads that succeed.
func withPath<T>(_ prefix: @autoclosure () -> [any CodingKey], _ body: () throws -> T) throws -> T {
    do {
        return try body()
    } catch let error as DecodingError {
        func context(_ context: DecodingError.Context) -> DecodingError.Context {
            DecodingError.Context(codingPath: prefix() + context.codingPath, debugDescription: context.debugDescription, underlyingError: context.underlyingError)
        }
        switch error {
        case .typeMismatch(let type, let found): throw DecodingError.typeMismatch(type, context(found))
        case .valueNotFound(let type, let found): throw DecodingError.valueNotFound(type, context(found))
        case .keyNotFound(let key, let found): throw DecodingError.keyNotFound(key, context(found))
        case .dataCorrupted(let found): throw DecodingError.dataCorrupted(context(found))
        @unknown default: throw error
        }
    }
}

extension BinaryReader {
    /// Reads a `T` from the keyed container at `offset` through its own `init(binary:)`; the
    /// container is at `codingPath` (empty when the caller puts the path in front of errors).
    func decodeDirect<T: BinaryDirectCodable>(_ type: T.Type, at offset: Int, limit: Int, depth: Int, codingPath: [any CodingKey]) throws -> T {
        let tag = try tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw typeMismatch(T.self, tag, codingPath) }
        guard depth < BinaryCoding.maxDepth else { throw corrupt(codingPath, "nested deeper than \(BinaryCoding.maxDepth)") }
        let body = try containerBody(at: offset, limit: limit, codingPath: codingPath)
        return try T(binary: BinaryFieldReader(reader: self, body: body, depth: depth + 1, codingPath: codingPath))
    }
}
