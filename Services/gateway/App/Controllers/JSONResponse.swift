import Foundation
import HTTPTypes
import Hummingbird

/// JSON responses in the API's conventions: camelCase keys, ISO 8601 UTC dates.
enum JSONResponse {
    /// The encoder of every JSON body the gateway writes (responses, problems, events), made
    /// once: `GatewayContext.responseEncoder`.
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    static func make(_ status: HTTPResponse.Status, _ value: some Encodable, headers: HTTPFields = [:]) throws -> Response {
        let data = try encoder.encode(value)
        var headers = headers
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}
