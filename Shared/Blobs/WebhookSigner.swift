import Foundation

/// Signs and checks the URLs a provider's webhook calls for a job:
/// `<PUBLIC_BASE_URL>/api/v1/providers/<provider>/webhook?job=<id>&exp=<unix>&sig=<hmac>`, the
/// HMAC keyed by `URL_SIGNING_SECRET` (the jobs service signs, the gateway checks): anyone without
/// the secret cannot name a job in a webhook. The gateway also checks fal's own ED25519 signature
/// on each delivery (`FalWebhookSignature`); a webhook must pass both.
public struct WebhookSigner: Sendable {
    let signer: URLSigner
    let publicBaseURL: String
    /// How long a webhook URL is good for: a generation's longest wait, with room.
    public let lifetime: Int

    public init(secret: String, publicBaseURL: String, lifetime: Int = 86_400) {
        signer = URLSigner(secret: secret)
        self.publicBaseURL = publicBaseURL.hasSuffix("/") ? String(publicBaseURL.dropLast()) : publicBaseURL
        self.lifetime = lifetime
    }

    /// The webhook URL for `jobId` at `provider`.
    public func url(provider: String, jobId: String, now: Date = Date()) -> String {
        let expires = Int(now.timeIntervalSince1970) + lifetime
        let sig = signer.signature(method: "WEBHOOK", key: jobId, owner: provider, contentType: "", expires: expires)
        var components = URLComponents()
        components.queryItems = [URLQueryItem(name: "job", value: jobId), URLQueryItem(name: "exp", value: String(expires)), URLQueryItem(name: "sig", value: sig)]
        return "\(publicBaseURL)/api/v1/providers/\(provider)/webhook?\(components.percentEncodedQuery ?? "")"
    }

    /// Whether `sig` is ours for `jobId` at `provider` and has not expired.
    public func verify(provider: String, jobId: String, expires: Int, sig: String, now: Date = Date()) -> Bool {
        signer.verify(signature: sig, method: "WEBHOOK", key: jobId, owner: provider, contentType: "", expires: expires, now: now)
    }
}

extension WebhookSigner: CustomStringConvertible {
    public var description: String { "WebhookSigner" }
}
