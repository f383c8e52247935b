import Bus
import Hummingbird
import Logging

/// One line per HTTP request at debug (per-request lines are not what an operator reads at
/// info; the metrics count them), written once the response is ready: method, path (without the
/// query, which may carry signatures or search terms), status, duration and the request id from
/// the logger's metadata. Nothing is built when debug is off.
public struct AccessLogMiddleware<Context: RequestContext>: RouterMiddleware {
    public init() {}

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard context.logger.logLevel <= .debug else { return try await next(request, context) }
        let started = ContinuousClock.now
        do {
            let response = try await next(request, context)
            log(request, context: context, status: Int(response.status.code), since: started)
            return response
        } catch let error as any HTTPResponseError {
            log(request, context: context, status: Int(error.status.code), since: started)
            throw error
        } catch {
            log(request, context: context, status: 500, since: started)
            throw error
        }
    }

    private func log(_ request: Request, context: Context, status: Int, since started: ContinuousClock.Instant) {
        context.logger.debug("\(request.method) \(request.uri.path) \(status) \(started.duration(to: .now).wholeMicroseconds)us")
    }
}
