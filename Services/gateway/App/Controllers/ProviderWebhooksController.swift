import Blobs
import Foundation
import Hummingbird
import Logging
import Messages

/// `POST /api/v1/providers/fal/webhook?job=&exp=&sig=`: fal's webhook for a generation submitted
/// to its queue (fal's queue documentation, "Webhooks": a POST whose JSON body is
/// `{request_id, gateway_request_id, status: "OK" | "ERROR", payload, error}`; fal retries
/// delivery, so it may come more than once).
///
/// The URL is signed by the jobs service when it hands the job to a worker (`WebhookSigner`,
/// keyed by `URL_SIGNING_SECRET`); a URL that does not verify answers 404 and changes nothing.
/// A verified one only tells the worker waiting on the job to ask fal now: the result is never
/// taken from the webhook's body, which anyone holding the URL could write, but fetched from fal
/// with our key. A webhook that comes twice asks twice; the job completes once.
struct ProviderWebhooksController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let webhooks: WebhookSigner
    let logger: Logger

    /// The providers whose webhooks are taken.
    static var providers: Set<String> { ["fal"] }
    /// The largest body read (fal's carries the result's URLs, not its bytes).
    static var maxBytes: Int { 1 << 20 }

    struct Body: Decodable {
        var requestId: String?
        enum CodingKeys: String, CodingKey { case requestId = "request_id" }
    }

    func addRoutes(to router: Router<Context>) {
        router.post("/api/v1/providers/:provider/webhook") { request, context in
            let provider = try context.parameters.require("provider")
            let query = request.uri.queryParameters
            guard Self.providers.contains(provider),
                  let job = query["job"].map(String.init), !job.isEmpty, job.utf8.count <= 256,
                  let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
                  webhooks.verify(provider: provider, jobId: job, expires: expires, sig: sig) else {
                throw Problem(.notFound, detail: "No such webhook.")
            }
            var requestId: String?
            if let body = try? await request.body.collect(upTo: Self.maxBytes) {
                requestId = (try? JSONDecoder().decode(Body.self, from: body))?.requestId
            }
            _ = try await clients.call(.jobs, Jobs.providerCallback, ProviderCallback(jobId: job, requestId: requestId))
            logger.debug("provider webhook", metadata: ["provider": "\(provider)", "job": "\(job)"])
            return try JSONResponse.make(.ok, ["received": true])
        }
    }
}
