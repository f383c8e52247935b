import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// The operators' view and controls of dispatching: the queue by effect and provider, the
/// providers' limits and jobs in flight, the workers (`GET /admin/v1/overview`, admin or viewer
/// token), and pausing, resuming, concurrency and draining (admin token; each audited).
struct AdminDispatchController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator

    struct ConcurrencyBody: Decodable {
        /// The most of the provider's jobs held at once; null: back to `JOBS_PROVIDER_CONCURRENCY`.
        var limit: Int?
    }

    func addRoutes(to router: Router<Context>) {
        router.get("/admin/v1/overview") { request, _ in
            try authenticator.requireOperator(request)
            return try JSONResponse.make(.ok, try await clients.call(.jobs, Admin.overview, Empty()))
        }
        let changes: [(path: String, parameter: String, change: @Sendable (String) -> DispatchControls.Change)] = [
            ("/admin/v1/effects/:effect/pause", "effect", { .pauseEffect($0) }),
            ("/admin/v1/effects/:effect/resume", "effect", { .resumeEffect($0) }),
            ("/admin/v1/providers/:provider/pause", "provider", { .pauseProvider($0) }),
            ("/admin/v1/providers/:provider/resume", "provider", { .resumeProvider($0) }),
            ("/admin/v1/workers/:workerId/drain", "workerId", { .drain($0) }),
            ("/admin/v1/workers/:workerId/undrain", "workerId", { .undrain($0) }),
        ]
        for (path, parameter, change) in changes {
            router.post(RouterPath(path)) { request, context in
                try authenticator.requireAdmin(request)
                let name = try Self.name(context, parameter)
                return try JSONResponse.make(.ok, try await clients.call(.jobs, Admin.control, AdminControl(change: change(name), actor: "admin")))
            }
        }
        router.put("/admin/v1/providers/:provider/concurrency") { request, context in
            try authenticator.requireAdmin(request)
            let provider = try Self.name(context, "provider")
            let body = try await JSONBody.decode(ConcurrencyBody.self, from: request, context: context)
            if let limit = body.limit, !(1...10_000).contains(limit) {
                throw Problem(.badRequest, detail: "limit must be 1 to 10000, or null for the configured one.")
            }
            return try JSONResponse.make(.ok, try await clients.call(.jobs, Admin.control, AdminControl(change: .providerLimit(provider, body.limit), actor: "admin")))
        }
    }

    /// A path parameter, percent-decoded, 1 to 256 bytes.
    static func name(_ context: Context, _ parameter: String) throws -> String {
        let raw = try context.parameters.require(parameter)
        guard let decoded = raw.removingPercentEncoding, (1...256).contains(decoded.utf8.count) else {
            throw Problem(.badRequest, detail: "The \(parameter) in the path must be 1 to 256 bytes of valid percent-encoding.")
        }
        return decoded
    }
}
