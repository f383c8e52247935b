import BinaryWire
import Foundation
import Messages

/// How a message body is written, named in each request's header; a reply uses its request's.
/// Binary is the default; JSON can be chosen per client (`BUS_ENCODING=json`) to read bodies when
/// debugging, and a server answers either.
public enum BusEncoding: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case json = 0
    case binary = 1

    public var description: String { self == .json ? "json" : "binary" }

    /// The encoding named `text` (`json` or `binary`, any case); nil for anything else.
    public init?(name text: String) {
        switch text.lowercased() {
        case "json": self = .json
        case "binary": self = .binary
        default: return nil
        }
    }
}

/// How message bodies are written on the bus: `Codable` values as JSON or in `BinaryCoding`.
enum BusCodec {
    static func encode<T: Encodable>(_ value: T, as encoding: BusEncoding) throws -> [UInt8] {
        switch encoding {
        case .binary: try BinaryCoding.encode(value)
        case .json: Array(try JSONEncoder().encode(value))
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8], as encoding: BusEncoding) throws -> T {
        switch encoding {
        case .binary: try BinaryCoding.decode(type, from: bytes)
        case .json: try JSONDecoder().decode(type, from: Data(bytes))
        }
    }

    /// A `BusError` as a reply body. Encoding a struct of strings and a flag cannot fail.
    static func encode(error: BusError, as encoding: BusEncoding) -> [UInt8] {
        (try? encode(error, as: encoding)) ?? Array(#"{"code":"internal","message":"unencodable error","retryable":false}"#.utf8)
    }

    /// Wall-clock milliseconds since 1970, the unit of request deadlines on the wire.
    static func nowMilliseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
    }
}
