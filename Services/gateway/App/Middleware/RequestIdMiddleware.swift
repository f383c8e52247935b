import Bus
import Foundation
import Hummingbird

/// Gives every request an `X-Request-Id` (the client's own when it sent a sane one, else
/// Hummingbird's id of the request: 32 hex digits), echoes it on
/// the response, puts it in the request's log lines and carries it on the bus as the trace id.
public struct RequestIdMiddleware<Context: RequestContext>: RouterMiddleware {
    public init() {}

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // Without a usable one of the client's, Hummingbird's own id of the request (random,
        // 128 bits, already made for its logger) rather than a second random id.
        let id = Self.acceptable(request.headers[.requestId]) ?? context.id
        var context = context
        context.logger[metadataKey: "request-id"] = "\(id)"
        var response = try await BusTrace.$id.withValue(id) {
            try await next(request, context)
        }
        response.headers[.requestId] = id
        return response
    }

    /// A client's id is kept when it is 1 to 128 visible ASCII characters.
    static func acceptable(_ value: String?) -> String? {
        guard let value, (1...128).contains(value.utf8.count),
              value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
        else { return nil }
        return value
    }
}
