import Bus
import Foundation
import Hummingbird

/// Gives every request an `X-Request-Id` (the client's own when it sent a sane one), echoes it on
/// the response, puts it in the request's log lines and carries it on the bus as the trace id.
public struct RequestIdMiddleware<Context: RequestContext>: RouterMiddleware {
    public init() {}

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let id = Self.acceptable(request.headers[.requestId]) ?? UUID().uuidString.lowercased()
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
