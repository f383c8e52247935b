import Foundation
import Bus
import Hummingbird
import HTTPTypes

/// An RFC 9457 problem: every error the gateway answers is one, as `application/problem+json`.
public struct Problem: Error, Sendable, HTTPResponseError {
    /// The HTTP status.
    public var status: HTTPResponse.Status
    /// A short, human-readable summary of the kind of problem.
    public var title: String
    /// What went wrong with this request.
    public var detail: String?
    /// A URI naming the kind of problem; `about:blank` when the status says it all.
    public var type: String
    /// Extra headers, such as `Retry-After`.
    public var headers: HTTPFields
    /// Extension members, such as the services that did not answer.
    public var extensions: [String: ProblemValue]

    public init(
        _ status: HTTPResponse.Status,
        title: String? = nil,
        detail: String? = nil,
        type: String = "about:blank",
        headers: HTTPFields = [:],
        extensions: [String: ProblemValue] = [:]
    ) {
        self.status = status
        self.title = title ?? status.reasonPhrase
        self.detail = detail
        self.type = type
        self.headers = headers
        self.extensions = extensions
    }

    /// The problem as a response, with the request's id as the `instance` member.
    public func response(from request: Request, context: some RequestContext) throws -> Response {
        response()
    }

    /// The problem as a response; `requestId` is the request's `X-Request-Id`, taken from the
    /// task's bus trace id when not given.
    public func response(requestId: String = BusTrace.id) -> Response {
        var members = extensions
        members["type"] = .string(type)
        members["title"] = .string(title)
        members["status"] = .int(Int(status.code))
        if let detail { members["detail"] = .string(detail) }
        if !requestId.isEmpty { members["requestId"] = .string(requestId) }
        let data = (try? JSONResponse.encoder.encode(members)) ?? Data("{}".utf8)
        var headers = self.headers
        headers[.contentType] = "application/problem+json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}

/// A JSON value in a problem's extension members.
public enum ProblemValue: Sendable, Encodable, Equatable {
    case string(String)
    case int(Int)
    case strings([String])
    case object([String: ProblemValue])

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .strings(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }
}

extension HTTPField.Name {
    /// `X-Request-Id`: the client's, or one the gateway makes; carried on the bus as the trace id.
    public static let requestId = HTTPField.Name("X-Request-Id")!
}
