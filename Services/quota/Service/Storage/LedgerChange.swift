import Foundation
import Messages
import QuotaCore

/// One change of one charge, as the quota ledger's log holds it: the charge's whole row after the
/// change, and the values the usage counters it moved were left at. Applying a change is writing
/// those rows as they are, so applying it twice is harmless, and of many changes to one row only
/// the last needs writing (what a checkpoint does).
struct LedgerChange: Sendable, Equatable {
    /// A usage counter's value after the change.
    struct Usage: Sendable, Equatable {
        var counter: UsageCounter
        var used: Int
    }

    /// The change's place in the log: 1, 2, 3… with no gaps.
    var seq: UInt64
    var jobId: String
    var userId: String
    var cost: Int
    var state: Charge.State
    var dayKey: String
    var monthKey: String
    /// The guest network whose shared daily credits the charge also drew on.
    var network: String?
    /// Seconds since 1970, to the millisecond (as the table stores them).
    var reservedAt: Double
    var settledAt: Double?
    /// At most three: the user's day and month, and the network's day.
    var usage: [Usage]

    var charge: Charge {
        Charge(jobId: jobId, userId: userId, cost: cost, state: state, dayKey: dayKey, monthKey: monthKey,
               reservedAt: Date(timeIntervalSince1970: reservedAt), settledAt: settledAt.map(Date.init(timeIntervalSince1970:)))
    }
}

/// One usage counter: an owner (a user id, or `net:` and a guest network), a window kind and the
/// window's key (`2026-11-25`, `2026-11`): a row of the `usage` table.
struct UsageCounter: Hashable, Sendable {
    var owner: String
    var window: String
    var key: String
}

/// The log's bytes: each change a frame of its payload's length (4 bytes, little-endian), the
/// payload's CRC-32 (4 bytes) and the payload. A frame cut short or whose checksum does not match
/// ends the log: it was being written when the process or machine stopped, before anyone was
/// answered.
enum LedgerFrame {
    static let headerSize = 8
    /// No change comes near it (ids are at most 256 bytes); a larger length is garbage.
    static let maxPayload = 4096
    private static let version: UInt8 = 1

    static func append(_ change: LedgerChange, to buffer: inout [UInt8]) {
        let start = buffer.count
        buffer.append(contentsOf: [0, 0, 0, 0, 0, 0, 0, 0])
        buffer.append(version)
        put(change.seq, &buffer)
        put(change.jobId, &buffer)
        put(change.userId, &buffer)
        // Signed (a grant is a negative charge): the same bytes as before for what is not.
        put(UInt64(bitPattern: Int64(change.cost)), &buffer)
        buffer.append(stateCode(change.state))
        put(change.dayKey, &buffer)
        put(change.monthKey, &buffer)
        buffer.append((change.network == nil ? 0 : 1) | (change.settledAt == nil ? 0 : 2))
        if let network = change.network { put(network, &buffer) }
        put(change.reservedAt.bitPattern, &buffer)
        if let settledAt = change.settledAt { put(settledAt.bitPattern, &buffer) }
        buffer.append(UInt8(change.usage.count))
        for usage in change.usage {
            put(usage.counter.owner, &buffer)
            put(usage.counter.window, &buffer)
            put(usage.counter.key, &buffer)
            put(UInt64(bitPattern: Int64(usage.used)), &buffer)
        }
        let length = UInt32(buffer.count - start - headerSize)
        let checksum = buffer.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[(start + headerSize)...])) }
        for index in 0..<4 {
            buffer[start + index] = UInt8(truncatingIfNeeded: length >> (8 * index))
            buffer[start + 4 + index] = UInt8(truncatingIfNeeded: checksum >> (8 * index))
        }
    }

    /// The changes in `bytes`, and how many bytes they take: reading stops at the end, or at the
    /// first frame that is cut short or damaged.
    static func read(_ bytes: UnsafeRawBufferPointer) -> (changes: [LedgerChange], validBytes: Int) {
        var changes: [LedgerChange] = []
        var offset = 0
        while bytes.count - offset >= headerSize {
            let length = Int(word(bytes, offset))
            let checksum = word(bytes, offset + 4)
            guard length > 0, length <= maxPayload, bytes.count - offset - headerSize >= length else { break }
            let payload = UnsafeRawBufferPointer(rebasing: bytes[(offset + headerSize)..<(offset + headerSize + length)])
            guard CRC32.checksum(payload) == checksum, let change = decode(payload) else { break }
            changes.append(change)
            offset += headerSize + length
        }
        return (changes, offset)
    }

    private static func decode(_ payload: UnsafeRawBufferPointer) -> LedgerChange? {
        var reader = Reader(bytes: payload)
        guard reader.byte() == version,
              let seq = reader.integer(), let jobId = reader.string(), let userId = reader.string(),
              let cost = reader.integer().map({ Int(Int64(bitPattern: $0)) }), abs(cost) <= max(QuotaRules.maxCost, AdjustCredits.maxCredits),
              let state = reader.byte().flatMap(state(code:)),
              let dayKey = reader.string(), let monthKey = reader.string(), let flags = reader.byte()
        else { return nil }
        var network: String?
        if flags & 1 != 0 { guard let value = reader.string() else { return nil }; network = value }
        guard let reservedAt = reader.integer().map(Double.init(bitPattern:)) else { return nil }
        var settledAt: Double?
        if flags & 2 != 0 { guard let value = reader.integer() else { return nil }; settledAt = Double(bitPattern: value) }
        guard let count = reader.byte(), count <= 3 else { return nil }
        var usage: [LedgerChange.Usage] = []
        for _ in 0..<count {
            guard let owner = reader.string(), let window = reader.string(), let key = reader.string(),
                  let used = reader.integer() else { return nil }
            usage.append(LedgerChange.Usage(counter: UsageCounter(owner: owner, window: window, key: key), used: Int(Int64(bitPattern: used))))
        }
        guard reader.atEnd else { return nil }
        return LedgerChange(seq: seq, jobId: jobId, userId: userId, cost: cost, state: state, dayKey: dayKey, monthKey: monthKey,
                            network: network, reservedAt: reservedAt, settledAt: settledAt, usage: usage)
    }

    private static func stateCode(_ state: Charge.State) -> UInt8 {
        switch state {
        case .reserved: 0
        case .committed: 1
        case .released: 2
        }
    }

    private static func state(code: UInt8) -> Charge.State? {
        switch code {
        case 0: .reserved
        case 1: .committed
        case 2: .released
        default: nil
        }
    }

    private static func put(_ value: UInt64, _ buffer: inout [UInt8]) {
        for index in 0..<8 { buffer.append(UInt8(truncatingIfNeeded: value >> (8 * index))) }
    }

    private static func put(_ text: String, _ buffer: inout [UInt8]) {
        let count = min(text.utf8.count, Int(UInt16.max))
        buffer.append(UInt8(truncatingIfNeeded: count))
        buffer.append(UInt8(truncatingIfNeeded: count >> 8))
        buffer.append(contentsOf: text.utf8.prefix(count))
    }

    private static func word(_ bytes: UnsafeRawBufferPointer, _ offset: Int) -> UInt32 {
        (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[offset + $1]) << (8 * $1) }
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0

        var atEnd: Bool { offset == bytes.count }

        mutating func byte() -> UInt8? {
            guard offset < bytes.count else { return nil }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func integer() -> UInt64? {
            guard bytes.count - offset >= 8 else { return nil }
            defer { offset += 8 }
            return (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[offset + $1]) << (8 * $1) }
        }

        mutating func string() -> String? {
            guard bytes.count - offset >= 2 else { return nil }
            let count = Int(bytes[offset]) | Int(bytes[offset + 1]) << 8
            guard bytes.count - offset - 2 >= count else { return nil }
            defer { offset += 2 + count }
            return String(validating: UnsafeRawBufferPointer(rebasing: bytes[(offset + 2)..<(offset + 2 + count)]), as: UTF8.self)
        }
    }
}

/// CRC-32 (IEEE 802.3, as zlib and gzip compute it).
enum CRC32 {
    private static let table: [UInt32] = (0..<256).map { index in
        (0..<8).reduce(UInt32(index)) { value, _ in value & 1 != 0 ? 0xEDB8_8320 ^ (value >> 1) : value >> 1 }
    }

    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        table.withUnsafeBufferPointer { table in
            for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        }
        return crc ^ 0xFFFF_FFFF
    }
}
