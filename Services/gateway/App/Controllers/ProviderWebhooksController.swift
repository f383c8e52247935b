import Blobs
import Foundation
import Hummingbird
import Logging
import Messages
import Metrics
import NIOCore
import Synchronization

/// `POST /api/v1/providers/fal/webhook?job=&exp=&sig=`: fal's webhook for a generation submitted
/// to its queue (fal's queue documentation, "Webhooks": a POST whose JSON body is
/// `{request_id, gateway_request_id, status: "OK" | "ERROR", payload, error}`; fal retries
/// delivery, so it may come more than once).
///
/// Two checks, both required; a webhook that fails either answers 401, is logged, and changes
/// nothing:
/// - the URL is ours: signed by the jobs service when it hands the job to a worker
///   (`WebhookSigner`, keyed by `URL_SIGNING_SECRET`), so it names a job we sent to fal;
/// - the delivery is fal's: its ED25519 signature over the request id, fal's user id, the
///   timestamp and the body's SHA-256, by a key from fal's JWKS (`FalWebhookSignature`).
/// A verified delivery only tells the worker waiting on the job to ask fal now: the result is
/// never taken from the webhook's body but fetched from fal with our key, so a webhook that comes
/// twice asks twice and the job completes once. The same signed delivery again (a replay) is
/// answered 200 and does nothing.
struct ProviderWebhooksController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let webhooks: WebhookSigner
    let signatures: FalWebhookSignature
    let logger: Logger
    let outcomes = ProviderWebhookOutcomes()

    /// The providers whose webhooks are taken.
    static var providers: Set<String> { ["fal"] }
    /// The largest body read (fal's carries the result's URLs, not its bytes).
    static var maxBytes: Int { 1 << 20 }

    func addRoutes(to router: Router<Context>) {
        router.post("/api/v1/providers/:provider/webhook") { request, context in
            let provider = try context.parameters.require("provider")
            let query = request.uri.queryParameters
            guard Self.providers.contains(provider) else { throw Problem(.notFound, detail: "No such webhook.") }
            guard let job = query["job"].map(String.init), !job.isEmpty, job.utf8.count <= 256,
                  let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
                  webhooks.verify(provider: provider, jobId: job, expires: expires, sig: sig) else {
                throw refuse(provider, "the webhook URL's signature is not ours or has expired")
            }
            let body: ByteBuffer
            do {
                body = try await request.body.collect(upTo: Self.maxBytes)
            } catch {
                throw Problem(.contentTooLarge, detail: "Webhook bodies are limited to \(Self.maxBytes) bytes.")
            }
            let requestId: String
            switch await signatures.verify(headers: request.headers, body: body) {
            case .valid(let signed):
                requestId = signed
            case .replayed:
                outcomes.replayed.increment()
                logger.debug("provider webhook replayed", metadata: ["provider": "\(provider)", "job": "\(job)"])
                return try JSONResponse.make(.ok, ["received": true])
            case .refused(let reason):
                throw refuse(provider, reason)
            case .unavailable(let reason):
                outcomes.unverifiable.increment()
                logger.warning("provider webhook not checked", metadata: ["provider": "\(provider)", "reason": "\(reason)"])
                throw Problem(.serviceUnavailable, detail: "The webhook's signature cannot be checked now.", headers: [.retryAfter: "60"])
            }
            _ = try await clients.call(.jobs, Jobs.providerCallback, ProviderCallback(jobId: job, requestId: requestId))
            outcomes.accepted.increment()
            logger.debug("provider webhook", metadata: ["provider": "\(provider)", "job": "\(job)"])
            return try JSONResponse.make(.ok, ["received": true])
        }
    }

    /// The 401 for a webhook that is not fal's or not for a URL of ours, counted and logged.
    func refuse(_ provider: String, _ reason: String) -> Problem {
        outcomes.refused.increment()
        logger.log(level: outcomes.warnNow() ? .warning : .debug, "provider webhook refused", metadata: ["provider": "\(provider)", "reason": "\(reason)"])
        return Problem(.unauthorized, detail: "The webhook's signature does not verify.")
    }
}

/// `gateway_provider_webhooks_total{outcome}`, and when a refusal was last logged at warning (the
/// rest go to debug: a flood of forged webhooks must not flood the log).
final class ProviderWebhookOutcomes: Sendable {
    let accepted = Counter(label: "gateway_provider_webhooks_total", dimensions: [("outcome", "accepted")])
    let replayed = Counter(label: "gateway_provider_webhooks_total", dimensions: [("outcome", "replayed")])
    let refused = Counter(label: "gateway_provider_webhooks_total", dimensions: [("outcome", "refused")])
    let unverifiable = Counter(label: "gateway_provider_webhooks_total", dimensions: [("outcome", "unverifiable")])
    let lastWarning = Mutex<ContinuousClock.Instant?>(nil)

    /// Whether a refusal now is logged at warning: at most one every 10 seconds.
    func warnNow() -> Bool {
        let now = ContinuousClock.now
        return lastWarning.withLock { last in
            guard last.map({ now - $0 > .seconds(10) }) ?? true else { return false }
            last = now
            return true
        }
    }
}
