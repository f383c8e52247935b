import Foundation
import Hummingbird

/// Reads a JSON request body with a size limit, with the context's decoder; anything wrong is a
/// 400 (or 413) problem naming the field.
enum JSONBody {
    /// The largest JSON body accepted.
    static let maxBytes = 64 * 1024

    /// The API's decoder (ISO 8601 dates), made once: `GatewayContext.requestDecoder`.
    static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()

    static func decode<T: Decodable>(_ type: T.Type, from request: Request, context: some GatewayRequestContext) async throws -> T {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: maxBytes)
        } catch {
            throw Problem(.contentTooLarge, detail: "The body is larger than \(maxBytes) bytes.")
        }
        do {
            return try context.requestDecoder.decode(type, from: Data(buffer: buffer))
        } catch DecodingError.keyNotFound(let key, _) {
            throw Problem(.badRequest, detail: "The field '\(key.stringValue)' is missing.")
        } catch DecodingError.typeMismatch(_, let where_), DecodingError.valueNotFound(_, let where_) {
            let path = where_.codingPath.map(\.stringValue).joined(separator: ".")
            throw Problem(.badRequest, detail: "The field '\(path)' has the wrong type.")
        } catch {
            throw Problem(.badRequest, detail: "The body is not valid JSON.")
        }
    }
}
