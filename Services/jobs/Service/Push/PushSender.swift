import AsyncHTTPClient
import Foundation
import JWTKit
import Logging
import Messages
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// What became of one push notification.
public enum PushOutcome: Sendable, Equatable {
    /// The push service took it.
    case delivered
    /// The push service no longer knows the token: the device is forgotten.
    case unregistered
    /// Refused for good (a malformed request, a wrong topic): logged for the operator.
    case rejected(String)
    /// Not now (429, 5xx, unreachable): tried again after the outbox's backoff.
    case retry
}

/// Sends job-end notifications to APNs and FCM, as each documents its API:
/// - APNs (developer.apple.com, "Sending notification requests to APNs" and "Establishing a
///   token-based connection to APNs"): `POST /3/device/{token}` over HTTP/2 with
///   `authorization: bearer <JWT>`, the JWT ES256-signed by the `.p8` key, its header naming the
///   key id (`kid`) and its claims the team id (`iss`) and when it was made (`iat`); made anew
///   every 40 minutes (Apple refuses one older than an hour, and one made more often than every
///   20 minutes). Headers `apns-topic`, `apns-push-type: alert`, `apns-priority: 10`,
///   `apns-collapse-id` (the job id: a notification sent again replaces the first on the
///   device), `apns-expiration`. 200 is taken; 410 `Unregistered` and 400 `BadDeviceToken` mean
///   the token is no longer good; 403 `ExpiredProviderToken` / `InvalidProviderToken`, 429 and
///   5xx are tried again (the first with a new JWT).
/// - FCM (firebase.google.com, "Send a message using FCM HTTP v1 API" and "Authorize send
///   requests"): an OAuth 2.0 access token from the service account (a JWT bearer assertion,
///   RS256, with `iss` the account's email, `scope` firebase.messaging, `aud` the token URI,
///   `iat` and `exp`), kept until a few minutes before it expires; then
///   `POST /v1/projects/{project}/messages:send` with `{"message": {"token", "notification",
///   "data", "android": {"collapse_key"}}}`. 404 or 400 whose `FcmError` is `UNREGISTERED`, and
///   `SENDER_ID_MISMATCH`, mean the token is no longer ours; 401 (the access token) is tried again
///   with a new one; 429 and 5xx are tried again.
public final class PushSender: Sendable {
    let settings: PushSettings
    let client: HTTPClient
    let logger: Logger
    private let apnsKeys: JWTKeyCollection?
    private let fcmKeys: JWTKeyCollection?
    private struct Tokens {
        var apns: (jwt: String, madeAt: ContinuousClock.Instant)?
        var fcm: (token: String, until: ContinuousClock.Instant)?
    }
    private let tokens = Mutex(Tokens())

    public init(settings: PushSettings, logger: Logger) async throws {
        self.settings = settings
        self.logger = logger
        // The keys first: a key that cannot be read stops the start with its error, before there
        // is an HTTP client to shut down (one dropped unclosed is a crash, not an error).
        if let apns = settings.apns {
            let keys = JWTKeyCollection()
            await keys.add(ecdsa: try ES256PrivateKey(pem: apns.keyPEM), kid: JWKIdentifier(string: apns.keyId))
            apnsKeys = keys
        } else {
            apnsKeys = nil
        }
        if let fcm = settings.fcm {
            let keys = JWTKeyCollection()
            await keys.add(rsa: try Insecure.RSA.PrivateKey(pem: fcm.privateKeyPEM), digestAlgorithm: .sha256)
            fcmKeys = keys
        } else {
            fcmKeys = nil
        }
        var configuration = HTTPClient.Configuration()
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caFile = settings.caFile { tls.additionalTrustRoots = [.file(caFile)] }
        configuration.tlsConfiguration = tls
        configuration.httpVersion = .automatic
        configuration.timeout = .init(connect: .seconds(10), read: .seconds(30))
        client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }

    /// Closes the HTTP client (at shutdown, after the relay stopped).
    public func shutdown() async {
        try? await client.shutdown()
    }

    /// Sends `notice` to its device's push service.
    public func send(_ notice: PushNotice) async -> PushOutcome {
        switch notice.platform {
        case .apns: await sendAPNs(notice, renewingToken: false)
        case .fcm: await sendFCM(notice, renewingToken: false)
        }
    }

    /// The alert a user reads.
    static func text(_ status: JobStatus) -> (title: String, body: String) {
        status == .completed ? ("Your edit is ready", "Tap to see it.") : ("Your edit could not be made", "Your credits were given back.")
    }

    // MARK: APNs

    struct APNsClaims: JWTPayload {
        var iss: IssuerClaim
        var iat: IssuedAtClaim
        func verify(using algorithm: some JWTAlgorithm) throws {}
    }

    func apnsToken(renew: Bool) async throws -> String {
        guard let apns = settings.apns, let keys = apnsKeys else { throw CancellationError() }
        let now = ContinuousClock.now
        if !renew, let held = tokens.withLock({ $0.apns }), now - held.madeAt < .seconds(40 * 60) { return held.jwt }
        let jwt = try await keys.sign(APNsClaims(iss: IssuerClaim(value: apns.teamId), iat: IssuedAtClaim(value: Date())), kid: JWKIdentifier(string: apns.keyId))
        tokens.withLock { $0.apns = (jwt, now) }
        return jwt
    }

    func sendAPNs(_ notice: PushNotice, renewingToken: Bool) async -> PushOutcome {
        guard let apns = settings.apns else { return .rejected("APNs is not configured") }
        let base = notice.environment == .sandbox ? apns.sandboxURL : apns.productionURL
        let (title, body) = Self.text(notice.status)
        let payload: [String: Any] = [
            "aps": ["alert": ["title": title, "body": body], "sound": "default"], "jobId": notice.jobId, "status": notice.status.rawValue,
        ]
        do {
            var request = HTTPClientRequest(url: "\(base)/3/device/\(notice.token)")
            request.method = .POST
            request.headers.add(name: "authorization", value: "bearer \(try await apnsToken(renew: renewingToken))")
            request.headers.add(name: "apns-topic", value: apns.topic)
            request.headers.add(name: "apns-push-type", value: "alert")
            request.headers.add(name: "apns-priority", value: "10")
            request.headers.add(name: "apns-collapse-id", value: String(notice.jobId.prefix(64)))
            request.headers.add(name: "apns-expiration", value: String(Int(Date().timeIntervalSince1970) + 86_400))
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: payload)))
            let response = try await client.execute(request, timeout: .seconds(10))
            let answer = try await response.body.collect(upTo: 64 << 10)
            let reason = (try? JSONSerialization.jsonObject(with: Data(buffer: answer)) as? [String: Any])?["reason"] as? String ?? ""
            switch (response.status.code, reason) {
            case (200, _): return .delivered
            case (410, _), (400, "BadDeviceToken"), (400, "DeviceTokenNotForTopic"): return .unregistered
            case (403, "ExpiredProviderToken"), (403, "InvalidProviderToken"):
                return renewingToken ? .retry : await sendAPNs(notice, renewingToken: true)
            case (429, _), (500...599, _): return .retry
            default: return .rejected("APNs answered \(response.status.code) \(reason)")
            }
        } catch {
            logger.debug("APNs unreachable", metadata: ["error": "\(error)"])
            return .retry
        }
    }

    // MARK: FCM

    struct AssertionClaims: JWTPayload {
        var iss: IssuerClaim
        var scope: String
        var aud: AudienceClaim
        var iat: IssuedAtClaim
        var exp: ExpirationClaim
        func verify(using algorithm: some JWTAlgorithm) throws {}
    }

    struct AccessToken: Decodable {
        var access_token: String
        var expires_in: Int?
    }

    /// An OAuth 2.0 access token for FCM, from the service account (nil: none could be had now).
    func fcmToken(renew: Bool) async throws -> String? {
        guard let fcm = settings.fcm, let keys = fcmKeys else { return nil }
        let now = ContinuousClock.now
        if !renew, let held = tokens.withLock({ $0.fcm }), now < held.until { return held.token }
        let issued = Date()
        let assertion = try await keys.sign(AssertionClaims(
            iss: IssuerClaim(value: fcm.clientEmail), scope: "https://www.googleapis.com/auth/firebase.messaging",
            aud: AudienceClaim(value: fcm.tokenURI), iat: IssuedAtClaim(value: issued), exp: ExpirationClaim(value: issued.addingTimeInterval(3600))
        ))
        var request = HTTPClientRequest(url: fcm.tokenURI)
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
        request.body = .bytes(ByteBuffer(string: "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"))
        let response = try await client.execute(request, timeout: .seconds(10))
        let answer = try await response.body.collect(upTo: 64 << 10)
        guard response.status == .ok, let token = try? JSONDecoder().decode(AccessToken.self, from: Data(buffer: answer)) else {
            logger.warning("FCM access token refused", metadata: ["status": "\(response.status.code)"])
            return nil
        }
        let lifetime = max(60, (token.expires_in ?? 3600) - 300)
        tokens.withLock { $0.fcm = (token.access_token, now.advanced(by: .seconds(lifetime))) }
        return token.access_token
    }

    func sendFCM(_ notice: PushNotice, renewingToken: Bool) async -> PushOutcome {
        guard let fcm = settings.fcm else { return .rejected("FCM is not configured") }
        let (title, body) = Self.text(notice.status)
        let message: [String: Any] = ["message": [
            "token": notice.token,
            "notification": ["title": title, "body": body],
            "data": ["jobId": notice.jobId, "status": notice.status.rawValue],
            "android": ["collapse_key": String(notice.jobId.prefix(64)), "priority": "high"],
        ]]
        do {
            guard let access = try await fcmToken(renew: renewingToken) else { return .retry }
            var request = HTTPClientRequest(url: "\(fcm.baseURL)/v1/projects/\(fcm.projectId)/messages:send")
            request.method = .POST
            request.headers.add(name: "authorization", value: "Bearer \(access)")
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: message)))
            let response = try await client.execute(request, timeout: .seconds(10))
            let answer = try await response.body.collect(upTo: 64 << 10)
            let code = Self.fcmErrorCode(Data(buffer: answer))
            switch (response.status.code, code) {
            case (200, _): return .delivered
            case (404, _), (_, "UNREGISTERED"), (_, "SENDER_ID_MISMATCH"): return .unregistered
            case (401, _): return renewingToken ? .retry : await sendFCM(notice, renewingToken: true)
            case (429, _), (500...599, _): return .retry
            default: return .rejected("FCM answered \(response.status.code) \(code ?? "")")
            }
        } catch {
            logger.debug("FCM unreachable", metadata: ["error": "\(error)"])
            return .retry
        }
    }

    /// The `errorCode` of FCM's error detail (`type.googleapis.com/google.firebase.fcm.v1.FcmError`).
    static func fcmErrorCode(_ body: Data) -> String? {
        let error = (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["error"] as? [String: Any]
        for detail in error?["details"] as? [[String: Any]] ?? [] where (detail["@type"] as? String)?.hasSuffix("FcmError") == true {
            return detail["errorCode"] as? String
        }
        return nil
    }
}
