import Foundation
import Messages

/// A message on a hot path that writes and reads its `BinaryCoding` form by hand, in exactly the
/// bytes its `Codable` form gives (its fields' names in declaration order, an absent optional left
/// out; read in any order, unknown fields skipped), so a peer may use either path and the tests
/// hold the two to the same bytes and values.
///
/// Why: Codable's generic containers look up type metadata for every container and every value
/// (`_swift_getGenericMetadata`, `KeyedDecodingContainer`'s box), which was most of the cost of
/// decoding a `QuotaStatus` in the gateway's `users/me` (perf: 6-7% of the machine, the largest
/// share of the gateway's own code). Only the few messages every request carries are written
/// this way (docs/bus.md); the rest stay plain `Codable`.
protocol BinaryDirectCodable: Codable {
    func writeBinary(_ fields: inout BinaryFieldWriter)
    init(binary fields: BinaryFieldReader) throws
}

// MARK: - Writing

/// Writes one keyed container's fields: a name, then its value as `BinaryWriter` writes it.
struct BinaryFieldWriter {
    let writer: BinaryWriter

    /// A field's name. Every value written after one closes the containers it opened (as
    /// `encodeValue` and `encodeDirect` do), so the container is still the innermost open one.
    @inline(__always) private func key(_ name: StaticString) {
        writer.writeVarint(UInt64(name.utf8CodeUnitCount))
        writer.bytes.append(contentsOf: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
    }

    mutating func write(_ name: StaticString, _ value: String) { key(name); writer.write(value) }
    mutating func write(_ name: StaticString, _ value: Int) { key(name); writer.write(Int64(value)) }
    mutating func write(_ name: StaticString, _ value: Bool) { key(name); writer.write(value) }
    mutating func write(_ name: StaticString, _ value: Double) { key(name); writer.write(value) }
    /// As `Date`'s own `Codable` writes it: seconds since 2001 as a double.
    mutating func write(_ name: StaticString, _ value: Date) { key(name); writer.write(value.timeIntervalSinceReferenceDate) }

    // Optionals as `encodeIfPresent` writes them: nothing when nil.
    mutating func write(_ name: StaticString, _ value: String?) { if let value { write(name, value) } }
    mutating func write(_ name: StaticString, _ value: Int?) { if let value { write(name, value) } }
    mutating func write(_ name: StaticString, _ value: Bool?) { if let value { write(name, value) } }
    mutating func write(_ name: StaticString, _ value: Date?) { if let value { write(name, value) } }

    /// An enum with `String` raw values, as its synthesized `Codable` writes it: the raw value.
    mutating func write<T: RawRepresentable>(raw name: StaticString, _ value: T) where T.RawValue == String {
        write(name, value.rawValue)
    }

    /// Strings, and enums with `String` raw values, in an array.
    mutating func write(_ name: StaticString, _ values: [String]) {
        let depth = openArray(name)
        for value in values { writer.write(value) }
        writer.close(downTo: depth)
    }

    mutating func write<T: RawRepresentable>(raw name: StaticString, _ values: [T]) where T.RawValue == String {
        let depth = openArray(name)
        for value in values { writer.write(value.rawValue) }
        writer.close(downTo: depth)
    }

    /// Messages written by hand, in an array.
    mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ values: [T]) {
        let depth = openArray(name)
        for value in values { writer.encodeDirect(value) }
        writer.close(downTo: depth)
    }

    /// A keyed container of the fields `body` writes: an enum case and its associated values, as
    /// Swift's synthesized `Codable` writes them (`{"case": {"_0": value, "label": value}}`, and
    /// an empty container for a case without values).
    mutating func nested(_ name: StaticString, _ body: (inout BinaryFieldWriter) -> Void = { _ in }) {
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

    /// A nested message written by hand.
    mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ value: T) {
        key(name)
        writer.encodeDirect(value)
    }

    /// A nested message written by hand, or nothing when nil.
    mutating func write<T: BinaryDirectCodable>(_ name: StaticString, _ value: T?) { if let value { write(name, value) } }

    /// Any other optional value, through its `Codable` form; nothing when nil.
    mutating func write<T: Encodable>(_ name: StaticString, _ value: T?) { if let value { write(name, value) } }

    /// Any other value, through its `Codable` form.
    mutating func write<T: Encodable>(_ name: StaticString, _ value: T) {
        key(name)
        do {
            try writer.encodeValue(value, codingPath: [DictionaryKey("\(name)")])
        } catch {
            if writer.error == nil { writer.error = error }
        }
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
struct BinaryFieldReader {
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
    @inline(__always) func forEach(_ read: (BinaryFieldName, BinaryFieldValue) throws -> Void) throws {
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
    func required<T>(_ value: T?, _ name: StaticString) throws -> T {
        guard let value else {
            let key = DictionaryKey("\(name)")
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for '\(key.stringValue)'"))
        }
        return value
    }
}

/// A field's name, matched against the message's names in a `switch` (`case "userId":`).
struct BinaryFieldName {
    let bytes: UnsafeRawBufferPointer

    @inline(__always) static func ~= (pattern: StaticString, name: BinaryFieldName) -> Bool {
        pattern.utf8CodeUnitCount == name.bytes.count
            && (name.bytes.isEmpty || memcmp(pattern.utf8Start, name.bytes.baseAddress!, name.bytes.count) == 0)
    }
}

/// One field's value, read as the message's type for it; a value of another type is the same
/// `DecodingError` the `Codable` path gives.
struct BinaryFieldValue {
    let fields: BinaryFieldReader
    /// Where the field's name is in the bytes.
    let name: Range<Int>
    let offset: Int
    let limit: Int

    private var reader: BinaryReader { fields.reader }

    /// The field's path, for errors only.
    var codingPath: [any CodingKey] { fields.codingPath + [DictionaryKey(String(decoding: reader.bytes[name], as: UTF8.self))] }

    var isNil: Bool { reader.bytes[offset] == BinaryCoding.Tag.null.rawValue }

    func string() throws -> String { try reader.decodeString(at: offset, limit: limit, codingPath: codingPath) }
    func int() throws -> Int { try reader.decodeInteger(Int.self, at: offset, limit: limit, codingPath: codingPath) }
    func bool() throws -> Bool { try reader.decodeBool(at: offset, limit: limit, codingPath: codingPath) }
    func double() throws -> Double { try reader.decodeDouble(at: offset, limit: limit, codingPath: codingPath) }
    func date() throws -> Date {
        Date(timeIntervalSinceReferenceDate: try reader.decodeDouble(at: offset, limit: limit, codingPath: codingPath))
    }

    // Optionals as `decodeIfPresent` reads them: nil for a nil value as for a missing field.
    func optionalString() throws -> String? { isNil ? nil : try string() }
    func optionalInt() throws -> Int? { isNil ? nil : try int() }
    func optionalBool() throws -> Bool? { isNil ? nil : try bool() }
    func optionalDate() throws -> Date? { isNil ? nil : try date() }

    /// An enum with `String` raw values, from its raw value.
    func raw<T: RawRepresentable>(_ type: T.Type) throws -> T where T.RawValue == String {
        try value(T.self, of: string())
    }

    /// An array of strings.
    func strings() throws -> [String] {
        var strings: [String] = []
        try forEachElement { offset, end in strings.append(try reader.decodeString(at: offset, limit: end, codingPath: codingPath)) }
        return strings
    }

    /// An array of enums with `String` raw values.
    func raws<T: RawRepresentable>(_ type: T.Type) throws -> [T] where T.RawValue == String {
        try strings().map { text in try value(T.self, of: text) }
    }

    /// The case of `text`, or the error `Codable` gives for a raw value no case has.
    private func value<T: RawRepresentable>(_ type: T.Type, of text: String) throws -> T where T.RawValue == String {
        guard let value = T(rawValue: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "Cannot initialize \(T.self) from invalid String value \(text)"))
        }
        return value
    }

    /// Messages written by hand, in an array.
    func array<T: BinaryDirectCodable>(_ type: T.Type) throws -> [T] {
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

    /// `read` with the fields of a keyed container: an enum case's associated values.
    func keyed<T>(_ read: (BinaryFieldReader) throws -> T) throws -> T {
        let tag = try reader.tag(at: offset, limit: limit, codingPath: codingPath)
        guard tag == .keyed else { throw reader.typeMismatch([String: Any].self, tag, codingPath) }
        guard fields.depth < BinaryCoding.maxDepth else { throw reader.corrupt(codingPath, "nested deeper than \(BinaryCoding.maxDepth)") }
        let body = try reader.containerBody(at: offset, limit: limit, codingPath: codingPath)
        return try withPath(codingPath) { try read(BinaryFieldReader(reader: reader, body: body, depth: fields.depth + 1, codingPath: [])) }
    }

    /// `value`, once the field is read as a keyed container: an enum case without associated
    /// values (its container is empty; fields a newer peer added are ignored).
    func without<T>(_ value: T) throws -> T {
        try keyed { _ in value }
    }

    /// The one field `name` of a keyed container, read by `read`: an enum case with one
    /// associated value.
    func single<T>(_ name: StaticString, _ read: (BinaryFieldValue) throws -> T) throws -> T {
        try keyed { inner in
            var value: T?
            try inner.forEach { field, found in if name ~= field { value = try read(found) } }
            return try inner.required(value, name)
        }
    }

    /// The fields `first` and `second` of a keyed container, each read by its function: an enum
    /// case with two associated values.
    func pair<A, B>(_ first: StaticString, _ readFirst: (BinaryFieldValue) throws -> A,
                    _ second: StaticString, _ readSecond: (BinaryFieldValue) throws -> B) throws -> (A, B) {
        try keyed { inner in
            var a: A?, b: B?
            try inner.forEach { field, found in
                if first ~= field { a = try readFirst(found) } else if second ~= field { b = try readSecond(found) }
            }
            return (try inner.required(a, first), try inner.required(b, second))
        }
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

    /// A nested message read by hand.
    func decode<T: BinaryDirectCodable>(_ type: T.Type) throws -> T {
        try withPath(codingPath) { try reader.decodeDirect(type, at: offset, limit: limit, depth: fields.depth, codingPath: []) }
    }

    /// Any other value, through its `Codable` form.
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try reader.decodeValue(type, at: offset, limit: limit, depth: fields.depth, codingPath: codingPath)
    }

    // Optional values as `decodeIfPresent` reads them, by hand or through `Codable`.
    func optional<T: BinaryDirectCodable>(_ type: T.Type) throws -> T? { isNil ? nil : try decode(type) }
    func optional<T: Decodable>(_ type: T.Type) throws -> T? { isNil ? nil : try decode(type) }
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

// MARK: - The messages of every request

extension UserReference: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("userId", userId)
    }

    init(binary fields: BinaryFieldReader) throws {
        var userId: String?
        try fields.forEach { name, value in
            switch name {
            case "userId": userId = try value.string()
            default: break
            }
        }
        self.init(userId: try fields.required(userId, "userId"))
    }
}

extension QuotaWindow: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("name", name)
        fields.write("limit", limit)
        fields.write("used", used)
        fields.write("remaining", remaining)
        fields.write("startsAt", startsAt)
        fields.write("resetsAt", resetsAt)
        fields.write("nominalSeconds", nominalSeconds)
    }

    init(binary fields: BinaryFieldReader) throws {
        var name: String?, limit: Int?, used: Int?, remaining: Int?, startsAt: Date?, resetsAt: Date?, nominalSeconds: Int?
        try fields.forEach { field, value in
            switch field {
            case "name": name = try value.string()
            case "limit": limit = try value.optionalInt()
            case "used": used = try value.int()
            case "remaining": remaining = try value.optionalInt()
            case "startsAt": startsAt = try value.date()
            case "resetsAt": resetsAt = try value.date()
            case "nominalSeconds": nominalSeconds = try value.int()
            default: break
            }
        }
        self.init(
            name: try fields.required(name, "name"), limit: limit, used: try fields.required(used, "used"), remaining: remaining,
            startsAt: try fields.required(startsAt, "startsAt"), resetsAt: try fields.required(resetsAt, "resetsAt"),
            nominalSeconds: try fields.required(nominalSeconds, "nominalSeconds")
        )
    }
}

extension QuotaStatus: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("userId", userId)
        fields.write("plan", plan)
        fields.write("isPro", isPro)
        fields.write("timeZone", timeZone)
        fields.write("daily", daily)
        fields.write("monthly", monthly)
        fields.write("retentionDays", retentionDays)
        fields.write("planEndsAt", planEndsAt)
    }

    init(binary fields: BinaryFieldReader) throws {
        var userId: String?, plan: String?, isPro: Bool?, timeZone: String?, daily: QuotaWindow?, monthly: QuotaWindow?
        var retentionDays: Int?, planEndsAt: Date?
        try fields.forEach { name, value in
            switch name {
            case "userId": userId = try value.string()
            case "plan": plan = try value.string()
            case "isPro": isPro = try value.bool()
            case "timeZone": timeZone = try value.optionalString()
            case "daily": daily = try value.decode(QuotaWindow.self)
            case "monthly": monthly = try value.decode(QuotaWindow.self)
            case "retentionDays": retentionDays = try value.int()
            case "planEndsAt": planEndsAt = try value.optionalDate()
            default: break
            }
        }
        self.init(
            userId: try fields.required(userId, "userId"), plan: try fields.required(plan, "plan"), isPro: try fields.required(isPro, "isPro"),
            timeZone: timeZone, daily: try fields.required(daily, "daily"), monthly: try fields.required(monthly, "monthly"),
            retentionDays: try fields.required(retentionDays, "retentionDays"), planEndsAt: planEndsAt
        )
    }
}

extension ReserveQuota: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("userId", userId)
        fields.write("jobId", jobId)
        fields.write("cost", cost)
        fields.write("network", network)
    }

    init(binary fields: BinaryFieldReader) throws {
        var userId: String?, jobId: String?, cost: Int?, network: String?
        try fields.forEach { name, value in
            switch name {
            case "userId": userId = try value.string()
            case "jobId": jobId = try value.string()
            case "cost": cost = try value.int()
            case "network": network = try value.optionalString()
            default: break
            }
        }
        self.init(userId: try fields.required(userId, "userId"), jobId: try fields.required(jobId, "jobId"), cost: try fields.required(cost, "cost"), network: network)
    }
}

extension QuotaDecision: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("admitted", admitted)
        fields.write("jobId", jobId)
        fields.write("status", status)
        fields.write("violated", violated)
        fields.write("retryAt", retryAt)
        fields.write("networkRemaining", networkRemaining)
    }

    init(binary fields: BinaryFieldReader) throws {
        var admitted: Bool?, jobId: String?, status: QuotaStatus?, violated: [String]?, retryAt: Date?, networkRemaining: Int?
        try fields.forEach { name, value in
            switch name {
            case "admitted": admitted = try value.bool()
            case "jobId": jobId = try value.string()
            case "status": status = try value.decode(QuotaStatus.self)
            case "violated": violated = try value.strings()
            case "retryAt": retryAt = try value.optionalDate()
            case "networkRemaining": networkRemaining = try value.optionalInt()
            default: break
            }
        }
        self.init(
            admitted: try fields.required(admitted, "admitted"), jobId: try fields.required(jobId, "jobId"),
            status: try fields.required(status, "status"), violated: try fields.required(violated, "violated"),
            retryAt: retryAt, networkRemaining: networkRemaining
        )
    }
}

// MARK: - Jobs and history pages

extension JobRecord: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("id", id)
        fields.write("userId", userId)
        fields.write("isPro", isPro)
        fields.write("imageKey", imageKey)
        fields.write("effectId", effectId)
        fields.write("parameters", parameters)
        fields.write("prompt", prompt)
        fields.write(raw: "status", status)
        fields.write("progress", progress)
        fields.write("attempts", attempts)
        fields.write("maxAttempts", maxAttempts)
        fields.write("lastError", lastError)
        fields.write("resultKey", resultKey)
        fields.write("thumbnailKey", thumbnailKey)
        fields.write("createdAt", createdAt)
        fields.write("updatedAt", updatedAt)
        fields.write("startedAt", startedAt)
        fields.write("finishedAt", finishedAt)
        fields.write("version", version)
        fields.write("cancelRequested", cancelRequested)
        fields.write("credits", credits)
        fields.write("submission", submission)
        fields.write("traceParent", traceParent)
        fields.write("imageETag", imageETag)
    }

    /// As `init(from:)`: `cancelRequested` defaults to false and `credits` to `Jobs.defaultCredits`.
    init(binary fields: BinaryFieldReader) throws {
        var id: String?, userId: String?, isPro: Bool?, imageKey: String?, effectId: String?, parameters: [String: Double]?
        var prompt: String?, status: JobStatus?, progress: Double?, attempts: Int?, maxAttempts: Int?, lastError: String?
        var resultKey: String?, thumbnailKey: String?, createdAt: Date?, updatedAt: Date?, startedAt: Date?, finishedAt: Date?
        var version: Int?, cancelRequested: Bool?, credits: Int?, submission: ProviderRequest?, traceParent: String?, imageETag: String?
        try fields.forEach { name, value in
            switch name {
            case "id": id = try value.string()
            case "userId": userId = try value.string()
            case "isPro": isPro = try value.bool()
            case "imageKey": imageKey = try value.string()
            case "effectId": effectId = try value.string()
            case "parameters": parameters = try value.decode([String: Double].self)
            case "prompt": prompt = try value.optionalString()
            case "status": status = try value.raw(JobStatus.self)
            case "progress": progress = try value.double()
            case "attempts": attempts = try value.int()
            case "maxAttempts": maxAttempts = try value.int()
            case "lastError": lastError = try value.optionalString()
            case "resultKey": resultKey = try value.optionalString()
            case "thumbnailKey": thumbnailKey = try value.optionalString()
            case "createdAt": createdAt = try value.date()
            case "updatedAt": updatedAt = try value.date()
            case "startedAt": startedAt = try value.optionalDate()
            case "finishedAt": finishedAt = try value.optionalDate()
            case "version": version = try value.int()
            case "cancelRequested": cancelRequested = try value.optionalBool()
            case "credits": credits = try value.optionalInt()
            case "submission": submission = try value.optional(ProviderRequest.self)
            case "traceParent": traceParent = try value.optionalString()
            case "imageETag": imageETag = try value.optionalString()
            default: break
            }
        }
        self.init(
            id: try fields.required(id, "id"), userId: try fields.required(userId, "userId"), isPro: try fields.required(isPro, "isPro"),
            imageKey: try fields.required(imageKey, "imageKey"), effectId: try fields.required(effectId, "effectId"),
            parameters: try fields.required(parameters, "parameters"), prompt: prompt, status: try fields.required(status, "status"),
            progress: try fields.required(progress, "progress"), attempts: try fields.required(attempts, "attempts"),
            maxAttempts: try fields.required(maxAttempts, "maxAttempts"), lastError: lastError, resultKey: resultKey,
            thumbnailKey: thumbnailKey, createdAt: try fields.required(createdAt, "createdAt"),
            updatedAt: try fields.required(updatedAt, "updatedAt"), startedAt: startedAt, finishedAt: finishedAt,
            version: try fields.required(version, "version"), cancelRequested: cancelRequested ?? false,
            credits: credits ?? Jobs.defaultCredits, submission: submission, traceParent: traceParent, imageETag: imageETag
        )
    }
}

extension RenderedHistoryPage: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("heads", heads)
        fields.write(raw: "statuses", statuses)
        fields.write("resultKeys", resultKeys)
        fields.write("thumbnailKeys", thumbnailKeys)
        fields.write("totalCount", totalCount)
        fields.write("hasMore", hasMore)
        fields.write("nextCursor", nextCursor)
        fields.write("sections", sections)
    }

    init(binary fields: BinaryFieldReader) throws {
        var heads: [String]?, statuses: [HistoryStatus]?, resultKeys: [String]?, thumbnailKeys: [String]?, totalCount: Int?
        var hasMore: Bool?, nextCursor: String?, sections: [Section]?
        try fields.forEach { name, value in
            switch name {
            case "heads": heads = try value.strings()
            case "statuses": statuses = try value.raws(HistoryStatus.self)
            case "resultKeys": resultKeys = try value.strings()
            case "thumbnailKeys": thumbnailKeys = try value.strings()
            case "totalCount": totalCount = try value.int()
            case "hasMore": hasMore = try value.bool()
            case "nextCursor": nextCursor = try value.optionalString()
            case "sections": sections = try value.optional([Section].self)
            default: break
            }
        }
        self.init(
            heads: try fields.required(heads, "heads"), statuses: try fields.required(statuses, "statuses"),
            resultKeys: try fields.required(resultKeys, "resultKeys"), thumbnailKeys: try fields.required(thumbnailKeys, "thumbnailKeys"),
            totalCount: try fields.required(totalCount, "totalCount"), hasMore: try fields.required(hasMore, "hasMore"),
            nextCursor: nextCursor, sections: sections
        )
    }
}

// MARK: - Job creation and the worker protocol's assignments

extension CreateJob: BinaryDirectCodable {
    /// As its `Codable` form: `traceParent` is set by the jobs service, never sent.
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("jobId", jobId)
        fields.write("userId", userId)
        fields.write("isPro", isPro)
        fields.write("imageKey", imageKey)
        fields.write("effectId", effectId)
        fields.write("parameters", parameters)
        fields.write("prompt", prompt)
        fields.write("credits", credits)
        fields.write("imageETag", imageETag)
    }

    /// As `init(from:)`: `credits` defaults to `Jobs.defaultCredits`.
    init(binary fields: BinaryFieldReader) throws {
        var jobId: String?, userId: String?, isPro: Bool?, imageKey: String?, effectId: String?, parameters: [String: Double]?
        var prompt: String?, credits: Int?, imageETag: String?
        try fields.forEach { name, value in
            switch name {
            case "jobId": jobId = try value.string()
            case "userId": userId = try value.string()
            case "isPro": isPro = try value.bool()
            case "imageKey": imageKey = try value.string()
            case "effectId": effectId = try value.string()
            case "parameters": parameters = try value.decode([String: Double].self)
            case "prompt": prompt = try value.optionalString()
            case "credits": credits = try value.optionalInt()
            case "imageETag": imageETag = try value.optionalString()
            default: break
            }
        }
        self.init(
            jobId: try fields.required(jobId, "jobId"), userId: try fields.required(userId, "userId"), isPro: try fields.required(isPro, "isPro"),
            imageKey: try fields.required(imageKey, "imageKey"), effectId: try fields.required(effectId, "effectId"),
            parameters: try fields.required(parameters, "parameters"), prompt: prompt, credits: credits ?? Jobs.defaultCredits,
            imageETag: imageETag
        )
    }
}

extension JobAttempt: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("jobId", jobId)
        fields.write("attempt", attempt)
    }

    init(binary fields: BinaryFieldReader) throws {
        var jobId: String?, attempt: Int?
        try fields.forEach { name, value in
            switch name {
            case "jobId": jobId = try value.string()
            case "attempt": attempt = try value.int()
            default: break
            }
        }
        self.init(jobId: try fields.required(jobId, "jobId"), attempt: try fields.required(attempt, "attempt"))
    }
}

extension PresignedWrite: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("key", key)
        fields.write("url", url)
        fields.write("headers", headers)
    }

    init(binary fields: BinaryFieldReader) throws {
        var key: String?, url: String?, headers: [String: String]?
        try fields.forEach { name, value in
            switch name {
            case "key": key = try value.string()
            case "url": url = try value.string()
            case "headers": headers = try value.decode([String: String].self)
            default: break
            }
        }
        self.init(key: try fields.required(key, "key"), url: try fields.required(url, "url"), headers: try fields.required(headers, "headers"))
    }
}

extension JobTransfer: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("inputURL", inputURL)
        fields.write("result", result)
        fields.write("thumbnail", thumbnail)
        fields.write("expiresAt", expiresAt)
    }

    init(binary fields: BinaryFieldReader) throws {
        var inputURL: String?, result: PresignedWrite?, thumbnail: PresignedWrite?, expiresAt: Date?
        try fields.forEach { name, value in
            switch name {
            case "inputURL": inputURL = try value.string()
            case "result": result = try value.decode(PresignedWrite.self)
            case "thumbnail": thumbnail = try value.decode(PresignedWrite.self)
            case "expiresAt": expiresAt = try value.date()
            default: break
            }
        }
        self.init(
            inputURL: try fields.required(inputURL, "inputURL"), result: try fields.required(result, "result"),
            thumbnail: try fields.required(thumbnail, "thumbnail"), expiresAt: try fields.required(expiresAt, "expiresAt")
        )
    }
}

extension JobAssignment: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("attempt", attempt)
        fields.write("userId", userId)
        fields.write("imageKey", imageKey)
        fields.write("effect", effect)
        fields.write("parameters", parameters)
        fields.write("prompt", prompt)
        fields.write("transfer", transfer)
        fields.write("submission", submission)
        fields.write("callbackURL", callbackURL)
        fields.write("traceParent", traceParent)
        fields.write("imageETag", imageETag)
    }

    init(binary fields: BinaryFieldReader) throws {
        var attempt: JobAttempt?, userId: String?, imageKey: String?, effect: EffectDescription?, parameters: [String: Double]?
        var prompt: String?, transfer: JobTransfer?, submission: ProviderRequest?, callbackURL: String?, traceParent: String?, imageETag: String?
        try fields.forEach { name, value in
            switch name {
            case "attempt": attempt = try value.decode(JobAttempt.self)
            case "userId": userId = try value.string()
            case "imageKey": imageKey = try value.string()
            case "effect": effect = try value.decode(EffectDescription.self)
            case "parameters": parameters = try value.decode([String: Double].self)
            case "prompt": prompt = try value.optionalString()
            case "transfer": transfer = try value.optional(JobTransfer.self)
            case "submission": submission = try value.optional(ProviderRequest.self)
            case "callbackURL": callbackURL = try value.optionalString()
            case "traceParent": traceParent = try value.optionalString()
            case "imageETag": imageETag = try value.optionalString()
            default: break
            }
        }
        self.init(
            attempt: try fields.required(attempt, "attempt"), userId: try fields.required(userId, "userId"),
            imageKey: try fields.required(imageKey, "imageKey"), effect: try fields.required(effect, "effect"),
            parameters: try fields.required(parameters, "parameters"), prompt: prompt, transfer: transfer, submission: submission,
            callbackURL: callbackURL, traceParent: traceParent, imageETag: imageETag
        )
    }
}

extension EffectDescription.Parameter: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("name", name)
        fields.write("minimum", minimum)
        fields.write("maximum", maximum)
        fields.write("defaultValue", defaultValue)
    }

    init(binary fields: BinaryFieldReader) throws {
        var name: String?, minimum: Double?, maximum: Double?, defaultValue: Double?
        try fields.forEach { field, value in
            switch field {
            case "name": name = try value.string()
            case "minimum": minimum = try value.double()
            case "maximum": maximum = try value.double()
            case "defaultValue": defaultValue = try value.double()
            default: break
            }
        }
        self.init(
            name: try fields.required(name, "name"), minimum: try fields.required(minimum, "minimum"),
            maximum: try fields.required(maximum, "maximum"), defaultValue: try fields.required(defaultValue, "defaultValue")
        )
    }
}

/// In every assignment: through `Codable` it was about 40% of decoding one.
extension EffectDescription: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("id", id)
        fields.write("title", title)
        fields.write("parameters", parameters)
        fields.write("processor", processor)
        fields.write("endpoint", endpoint)
        fields.write("credits", credits)
        fields.write(raw: "kind", kind)
        fields.write("model", model)
        fields.write("timeoutSeconds", timeoutSeconds)
    }

    /// As `init(from:)`: every field but `id` may be missing (or nil), and has its default.
    init(binary fields: BinaryFieldReader) throws {
        var id: String?, title: String?, parameters: [Parameter]?, processor: String?, endpoint: String?, credits: Int?
        var kind: MediaKind?, model: String?, timeoutSeconds: Int?
        try fields.forEach { name, value in
            switch name {
            case "id": id = try value.string()
            case "title": title = try value.optionalString()
            case "parameters": parameters = value.isNil ? nil : try value.array(Parameter.self)
            case "processor": processor = try value.optionalString()
            case "endpoint": endpoint = try value.optionalString()
            case "credits": credits = try value.optionalInt()
            case "kind": kind = value.isNil ? nil : try value.raw(MediaKind.self)
            case "model": model = try value.optionalString()
            case "timeoutSeconds": timeoutSeconds = try value.optionalInt()
            default: break
            }
        }
        let required = try fields.required(id, "id")
        self.init(
            id: required, title: title ?? required, parameters: parameters ?? [], processor: processor ?? "vips", endpoint: endpoint,
            credits: credits ?? Jobs.defaultCredits, kind: kind ?? .image, model: model, timeoutSeconds: timeoutSeconds
        )
    }
}

extension JobOutput: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("resultKey", resultKey)
        fields.write("thumbnailKey", thumbnailKey)
    }

    init(binary fields: BinaryFieldReader) throws {
        var resultKey: String?, thumbnailKey: String?
        try fields.forEach { name, value in
            switch name {
            case "resultKey": resultKey = try value.string()
            case "thumbnailKey": thumbnailKey = try value.string()
            default: break
            }
        }
        self.init(resultKey: try fields.required(resultKey, "resultKey"), thumbnailKey: try fields.required(thumbnailKey, "thumbnailKey"))
    }
}

extension WatchJobs.Seen: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("jobId", jobId)
        fields.write("userId", userId)
        fields.write("version", version)
        fields.write("progress", progress)
    }

    init(binary fields: BinaryFieldReader) throws {
        var jobId: String?, userId: String?, version: Int?, progress: Double?
        try fields.forEach { name, value in
            switch name {
            case "jobId": jobId = try value.string()
            case "userId": userId = try value.string()
            case "version": version = try value.int()
            case "progress": progress = try value.double()
            default: break
            }
        }
        self.init(
            jobId: try fields.required(jobId, "jobId"), userId: try fields.required(userId, "userId"),
            version: try fields.required(version, "version"), progress: try fields.required(progress, "progress")
        )
    }
}

/// The gateway's job streams ask `jobs.watch` for their jobs every few hundred milliseconds.
extension WatchJobs: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("jobs", jobs)
    }

    init(binary fields: BinaryFieldReader) throws {
        var jobs: [Seen]?
        try fields.forEach { name, value in
            switch name {
            case "jobs": jobs = try value.array(Seen.self)
            default: break
            }
        }
        self.init(jobs: try fields.required(jobs, "jobs"))
    }
}

extension WatchedJobs: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        fields.write("changed", changed)
        fields.write("gone", gone)
    }

    init(binary fields: BinaryFieldReader) throws {
        var changed: [JobRecord]?, gone: [String]?
        try fields.forEach { name, value in
            switch name {
            case "changed": changed = try value.array(JobRecord.self)
            case "gone": gone = try value.strings()
            default: break
            }
        }
        self.init(changed: try fields.required(changed, "changed"), gone: try fields.required(gone, "gone"))
    }
}

// MARK: - The worker protocol's messages

/// An enum's case, as its synthesized `Codable` reads it: exactly one key of a known case
/// (unknown keys are not its cases, and are left out), or a type mismatch.
private struct EnumCase<Value> {
    var value: Value?
    var count = 0

    mutating func found(_ value: Value) {
        self.value = value
        count += 1
    }

    func value(of type: Any.Type, _ fields: BinaryFieldReader) throws -> Value {
        guard count == 1, let value else {
            throw DecodingError.typeMismatch(type, .init(codingPath: fields.codingPath, debugDescription: "Invalid number of keys found, expected one."))
        }
        return value
    }
}

extension WorkerMessage: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        switch self {
        case .ready(let ready): fields.nested("ready") { $0.write("_0", ready) }
        case .heartbeat(let running): fields.nested("heartbeat") { $0.write("running", running) }
        case .progress(let attempt, let fraction):
            fields.nested("progress") {
                $0.write("_0", attempt)
                $0.write("fraction", fraction)
            }
        case .done(let attempt, let output):
            fields.nested("done") {
                $0.write("_0", attempt)
                $0.write("_1", output)
            }
        case .failed(let attempt, let error, let retryable):
            fields.nested("failed") {
                $0.write("_0", attempt)
                $0.write("error", error)
                $0.write("retryable", retryable)
            }
        case .cancelled(let attempt): fields.nested("cancelled") { $0.write("_0", attempt) }
        case .metrics(let text): fields.nested("metrics") { $0.write("_0", text) }
        case .leaving(let returned): fields.nested("leaving") { $0.write("returned", returned) }
        case .renew(let attempt): fields.nested("renew") { $0.write("_0", attempt) }
        case .submitted(let attempt, let request):
            fields.nested("submitted") {
                $0.write("_0", attempt)
                $0.write("_1", request)
            }
        case .answered(let attempt): fields.nested("answered") { $0.write("_0", attempt) }
        case .all(let messages): fields.nested("all") { $0.write("_0", messages) }
        }
    }

    init(binary fields: BinaryFieldReader) throws {
        var message = EnumCase<WorkerMessage>()
        try fields.forEach { name, value in
            switch name {
            case "ready": message.found(.ready(try value.single("_0") { try $0.decode(WorkerReady.self) }))
            case "heartbeat": message.found(.heartbeat(running: try value.single("running") { try $0.array(JobAttempt.self) }))
            case "progress":
                let (attempt, fraction) = try value.pair("_0", { try $0.decode(JobAttempt.self) }, "fraction", { try $0.double() })
                message.found(.progress(attempt, fraction: fraction))
            case "done":
                let (attempt, output) = try value.pair("_0", { try $0.decode(JobAttempt.self) }, "_1", { try $0.decode(JobOutput.self) })
                message.found(.done(attempt, output))
            case "failed":
                message.found(try value.keyed { inner in
                    var attempt: JobAttempt?, error: String?, retryable: Bool?
                    try inner.forEach { name, value in
                        switch name {
                        case "_0": attempt = try value.decode(JobAttempt.self)
                        case "error": error = try value.string()
                        case "retryable": retryable = try value.bool()
                        default: break
                        }
                    }
                    return .failed(
                        try inner.required(attempt, "_0"), error: try inner.required(error, "error"), retryable: try inner.required(retryable, "retryable")
                    )
                })
            case "cancelled": message.found(.cancelled(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "metrics": message.found(.metrics(try value.single("_0") { try $0.string() }))
            case "leaving": message.found(.leaving(returned: try value.single("returned") { try $0.array(JobAttempt.self) }))
            case "renew": message.found(.renew(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "submitted":
                let (attempt, request) = try value.pair("_0", { try $0.decode(JobAttempt.self) }, "_1", { try $0.decode(ProviderRequest.self) })
                message.found(.submitted(attempt, request))
            case "answered": message.found(.answered(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "all": message.found(.all(try value.single("_0") { try $0.array(WorkerMessage.self) }))
            default: break
            }
        }
        self = try message.value(of: WorkerMessage.self, fields)
    }
}

extension DispatcherMessage: BinaryDirectCodable {
    func writeBinary(_ fields: inout BinaryFieldWriter) {
        switch self {
        case .assign(let assignment): fields.nested("assign") { $0.write("_0", assignment) }
        case .cancel(let attempt): fields.nested("cancel") { $0.write("_0", attempt) }
        case .heartbeat: fields.nested("heartbeat")
        case .reconnect: fields.nested("reconnect")
        case .refused(let attempt, let reason):
            fields.nested("refused") {
                $0.write("_0", attempt)
                $0.write("reason", reason)
            }
        case .recorded(let attempt): fields.nested("recorded") { $0.write("_0", attempt) }
        case .renewed(let attempt, let transfer):
            fields.nested("renewed") {
                $0.write("_0", attempt)
                $0.write("_1", transfer)
            }
        case .submissionRecorded(let attempt): fields.nested("submissionRecorded") { $0.write("_0", attempt) }
        case .poke(let attempt): fields.nested("poke") { $0.write("_0", attempt) }
        case .leaveNoted: fields.nested("leaveNoted")
        case .batches: fields.nested("batches")
        case .all(let messages): fields.nested("all") { $0.write("_0", messages) }
        }
    }

    init(binary fields: BinaryFieldReader) throws {
        var message = EnumCase<DispatcherMessage>()
        try fields.forEach { name, value in
            switch name {
            case "assign": message.found(.assign(try value.single("_0") { try $0.decode(JobAssignment.self) }))
            case "cancel": message.found(.cancel(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "heartbeat": message.found(try value.without(.heartbeat))
            case "reconnect": message.found(try value.without(.reconnect))
            case "refused":
                let (attempt, reason) = try value.pair("_0", { try $0.decode(JobAttempt.self) }, "reason", { try $0.string() })
                message.found(.refused(attempt, reason: reason))
            case "recorded": message.found(.recorded(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "renewed":
                let (attempt, transfer) = try value.pair("_0", { try $0.decode(JobAttempt.self) }, "_1", { try $0.decode(JobTransfer.self) })
                message.found(.renewed(attempt, transfer))
            case "submissionRecorded": message.found(.submissionRecorded(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "poke": message.found(.poke(try value.single("_0") { try $0.decode(JobAttempt.self) }))
            case "leaveNoted": message.found(try value.without(.leaveNoted))
            case "batches": message.found(try value.without(.batches))
            case "all": message.found(.all(try value.single("_0") { try $0.array(DispatcherMessage.self) }))
            default: break
            }
        }
        self = try message.value(of: DispatcherMessage.self, fields)
    }
}
