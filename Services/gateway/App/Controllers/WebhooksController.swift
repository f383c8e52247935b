import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Messages
import Synchronization

/// `POST /webhooks/adapty`: the paywall's subscription events (Adapty's server-side webhook)
/// become plan changes in quota, each applied once and in order per user, durably before the 200.
///
/// The request must carry `Authorization: <ADAPTY_WEBHOOK_SECRET>` exactly as configured in
/// Adapty's dashboard (compared in constant time; 401 otherwise); with no secret configured the
/// route does not exist (404). `customer_user_id` is our user id. The envelope and the event
/// names follow Adapty's documentation ("Webhook event types and fields", "Set up webhook
/// integration"): `{profile_id, customer_user_id, event_type, event_datetime, event_properties:
/// {profile_event_id, subscription_expires_at, ...}}`; `access_level_updated` carries
/// `is_active` and `expires_at`.
struct WebhooksController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let adaptySecret: String?
    let logger: Logger
    /// Events received, by what was done with them: applied, duplicate, stale, ignored.
    let counts = WebhookCounts()

    /// The largest webhook body accepted (Adapty's events are a few kilobytes).
    static var maxBytes: Int { 256 * 1024 }

    /// Event types that give the user PRO until the period's end the event carries.
    static var grants: Set<String> {
        ["subscription_started", "subscription_renewed", "subscription_renewal_reactivated", "trial_started", "trial_converted"]
    }

    /// Event types that end PRO.
    static var revokes: Set<String> { ["subscription_expired", "trial_expired", "subscription_refunded"] }

    /// The plan a grant gives.
    static var plan: String { "pro" }

    struct Envelope: Decodable {
        var profileId: String?
        var customerUserId: String?
        var eventType: String?
        var eventDatetime: String?
        var eventProperties: Properties?
        /// The older verification request: `{"adapty_check": "<string>"}`.
        var adaptyCheck: String?

        struct Properties: Decodable {
            var profileEventId: String?
            var subscriptionExpiresAt: String?
            var expiresAt: String?
            var isActive: Bool?
            var accessLevelId: String?
        }
    }

    func addRoutes(to router: Router<Context>) {
        router.post("/webhooks/adapty") { request, _ in
            try await adapty(request)
        }
        // What the webhook has received since the gateway started, by outcome.
        router.get("/admin/v1/webhooks/adapty") { request, _ in
            try authenticator.requireOperator(request)
            return try JSONResponse.make(.ok, counts.all)
        }
    }

    func adapty(_ request: Request) async throws -> Response {
        guard let secret = adaptySecret else {
            throw Problem(.notFound, detail: "No webhook is configured here.")
        }
        guard let given = request.headers[.authorization], Authenticator.constantTimeEqual(Array(given.utf8), Array(secret.utf8)) else {
            throw Problem(.unauthorized, detail: "The Authorization header does not match the webhook secret.")
        }
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: Self.maxBytes)
        } catch {
            throw Problem(.contentTooLarge, detail: "Webhook bodies are limited to \(Self.maxBytes) bytes.")
        }
        let bytes = Data(buffer: body)
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        let envelope: Envelope
        do {
            envelope = try decoder.decode(Envelope.self, from: bytes)
        } catch {
            throw Problem(.badRequest, detail: "The body is not an Adapty webhook event (\(error)).")
        }
        // The verification request Adapty sends when the integration is saved: `{}` (answered
        // with a JSON body), or in older integrations `{"adapty_check": s}` (answered with s).
        if let check = envelope.adaptyCheck {
            return try JSONResponse.make(.ok, ["adapty_check_response": check])
        }
        guard let type = envelope.eventType else {
            return try JSONResponse.make(.ok, [String: String]())
        }
        guard let userId = envelope.customerUserId, !userId.isEmpty else {
            return try ignored(type, "the event has no customer_user_id")
        }
        let effect: SubscriptionEvent.Effect
        let endsAt: Date?
        if Self.grants.contains(type) {
            effect = .grant
            endsAt = try Self.date(envelope.eventProperties?.subscriptionExpiresAt, field: "subscription_expires_at")
        } else if Self.revokes.contains(type) {
            effect = .revoke
            endsAt = nil
        } else if type == "access_level_updated", let active = envelope.eventProperties?.isActive {
            effect = active ? .grant : .revoke
            endsAt = try Self.date(envelope.eventProperties?.expiresAt, field: "expires_at")
                ?? Self.date(envelope.eventProperties?.subscriptionExpiresAt, field: "subscription_expires_at")
        } else {
            return try ignored(type, "the event type is not one this backend acts on")
        }
        guard let occurredAt = try Self.date(envelope.eventDatetime, field: "event_datetime") else {
            throw Problem(.badRequest, detail: "The event has no event_datetime.")
        }
        // Adapty's own event id, or (for integrations that replaced it) a hash of the body.
        let eventId = envelope.eventProperties?.profileEventId
            ?? "sha256:" + SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
        let outcome = try await clients.call(.quota, Quota.applySubscription, SubscriptionEvent(
            eventId: String(eventId.prefix(200)), userId: userId, effect: effect, plan: Self.plan,
            endsAt: effect == .grant ? endsAt : nil, occurredAt: occurredAt, type: type
        ))
        counts.add(outcome.result)
        logger.info("subscription event", metadata: [
            "type": "\(type)", "user": "\(userId)", "result": "\(outcome.result)", "plan": "\(outcome.status.plan)",
        ])
        return try JSONResponse.make(.ok, Answer(result: outcome.result, plan: outcome.status.plan, isPro: outcome.status.isPro, planEndsAt: outcome.status.planEndsAt))
    }

    struct Answer: Encodable {
        var result: String
        var plan: String?
        var isPro: Bool?
        var planEndsAt: Date?
        var reason: String?
    }

    /// A well-formed event this backend does not act on: 200 (so Adapty does not retry it), counted.
    func ignored(_ type: String, _ reason: String) throws -> Response {
        counts.add("ignored")
        logger.debug("subscription event ignored", metadata: ["type": "\(type.prefix(64))", "reason": "\(reason)"])
        return try JSONResponse.make(.ok, Answer(result: "ignored", reason: reason))
    }

    /// Adapty's timestamps: ISO 8601 with or without fractional seconds (up to microseconds) and
    /// with `Z`, `+00:00` or `+0000`. Nil when absent; 400 when present and unreadable.
    static func date(_ text: String?, field: String) throws -> Date? {
        guard let text, !text.isEmpty else { return nil }
        for format in ["yyyy-MM-dd'T'HH:mm:ss.SSSSSSZ", "yyyy-MM-dd'T'HH:mm:ss.SSSZ", "yyyy-MM-dd'T'HH:mm:ssZ"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.dateFormat = format
            if let date = formatter.date(from: text) { return date }
        }
        throw Problem(.badRequest, detail: "\(field) is not an ISO 8601 time: \(text.prefix(64))")
    }
}

/// How many webhook events were applied, were duplicates, stale, or ignored, since start.
final class WebhookCounts: Sendable {
    private let counts = Mutex<[String: Int]>([:])
    func add(_ result: String) { counts.withLock { $0[result, default: 0] += 1 } }
    var all: [String: Int] { counts.withLock { $0 } }
}
