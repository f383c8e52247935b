import Hummingbird

/// Checks who a request comes from, once, for the routes added behind it (a bearer token, or a
/// guest's device id; 401 otherwise) and puts the caller in the context.
struct AuthenticationMiddleware<Context: GatewayRequestContext>: RouterMiddleware {
    let authenticator: Authenticator

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var context = context
        context.identity = try await authenticator.caller(of: request)
        return try await next(request, context)
    }
}
