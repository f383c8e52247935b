import Blobs
import Bus
import HTTPTypes
import Hummingbird
import Logging
import Messages

/// Turns every error into an `application/problem+json` response: problems as they are, HTTP
/// errors by their status, bus errors by `Problem.init(_:service:)`, anything else as 500.
public struct ProblemMiddleware<Context: RequestContext>: RouterMiddleware {
    public init() {}

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch {
            let problem = Self.problem(for: error, context: context)
            return problem.response()
        }
    }

    static func problem(for error: any Error, context: Context) -> Problem {
        switch error {
        case let problem as Problem:
            return problem
        case let error as HTTPError:
            return Problem(error.status, detail: error.body, headers: error.headers)
        case let error as BusError:
            return Problem(error, service: "bus")
        case let error as BlobStoreError:
            // The store failed (not the request): logged once, not once per request.
            blobFailures.record(error.kind.rawValue, "the blob store failed: \(error)")
            let code: BusError.Code = error.kind == .full ? .storageFull : .storageUnavailable
            return Problem(BusError(code, error.kind == .full ? "The file store is full. Try again later." : "The file store cannot be reached. Try again shortly."), service: "blobs")
        case let error as any HTTPResponseError:
            return Problem(error.status)
        default:
            context.logger.error("unhandled error", metadata: ["error": "\(error)"])
            return Problem(.internalServerError, detail: "The server failed to handle the request.")
        }
    }
}

/// Failures of the blob store met while answering requests, logged once a kind.
let blobFailures = FailureLog(logger: Logger(label: "gateway"))
