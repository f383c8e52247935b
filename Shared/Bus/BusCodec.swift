import Foundation
import Messages

/// How message bodies are written on the bus: JSON through `Codable`.
enum BusCodec {
    static func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        Array(try JSONEncoder().encode(value))
    }

    static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
        try JSONDecoder().decode(type, from: Data(bytes))
    }

    /// A `BusError` as a reply body. Encoding a struct of strings and a flag cannot fail.
    static func encode(error: BusError) -> [UInt8] {
        (try? encode(error)) ?? Array(#"{"code":"internal","message":"unencodable error","retryable":false}"#.utf8)
    }

    /// Wall-clock milliseconds since 1970, the unit of request deadlines on the wire.
    static func nowMilliseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
    }
}
