import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdHTTP2
import JWTKit
import Logging
import NIOCore
import NIOSSL
import SwiftASN1
import Synchronization
import X509

// A local stand-in for the push services jobs sends to, for tests: Apple's APNs provider API and
// Firebase Cloud Messaging's HTTP v1 API with its OAuth 2.0 token endpoint, over TLS with HTTP/2
// (a certificate made at start for 127.0.0.1 and localhost, written to FIXTURE_CA_FILE for the
// client to trust). Each checks what it is sent as the real service would and answers in its
// documented shapes:
// - APNs (developer.apple.com, "Sending notification requests to APNs", "Handling notification
//   responses from APNs", "Establishing a token-based connection"): `POST /3/device/{token}`,
//   `authorization: bearer <JWT>` ES256 by the team's key (`kid` the key id, `iss` the team id,
//   `iat` within the hour), `apns-topic` the app's bundle id, `apns-push-type`, a JSON body with
//   `aps`; 200 with `apns-id`, errors as `{"reason": ...}` (410 adds `timestamp`).
// - FCM (firebase.google.com, "Send a message using FCM HTTP v1 API", "Authorize send requests"
//   and Google's OAuth 2.0 for service accounts): `POST /token` takes a form with
//   `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` and an RS256 `assertion` by the
//   service account's key (`iss` its email, `scope` firebase.messaging, `aud` this token URI,
//   `iat`, `exp` at most an hour on) and answers `{"access_token", "expires_in", "token_type"}`;
//   `POST /v1/projects/{project}/messages:send` with that bearer token and `{"message":
//   {"token", ...}}` answers `{"name"}`, errors as Google's `{"error": {"code", "message",
//   "status", "details": [{"@type": ".../google.firebase.fcm.v1.FcmError", "errorCode"}]}}`.
//
// The device token steers the answer: `gone...` is no longer registered (APNs 410
// `Unregistered`, FCM 404 `UNREGISTERED`); `busy...` is answered 429 once, then taken;
// `flaky...` 500 (APNs `InternalServerError`) or 503 (FCM `UNAVAILABLE`) once, then taken.
// `GET /_fixture/stats`: the notifications taken, by token, and anything a real service would
// have refused (`rejected`, which tests require to stay empty).
//
// FIXTURE_PORT (required), FIXTURE_CA_FILE (required: where the certificate goes),
// FIXTURE_APNS_KEY_FILE / FIXTURE_APNS_KEY_ID / FIXTURE_APNS_TEAM_ID / FIXTURE_APNS_TOPIC (the
// team's key and names), FIXTURE_FCM_ACCOUNT_FILE (the service account JSON key).

struct Delivery: Codable {
    var platform: String
    var token: String
    var jobId: String
    var status: String
    var collapseId: String?
}

struct Stats: Codable {
    var deliveries: [Delivery] = []
    var refusals: [String: Int] = [:]
    var rejected: [String] = []
    var tokenGrants = 0
}

final class State: Sendable {
    let stats = Mutex(Stats())
    let accessTokens = Mutex<Set<String>>([])
    /// The tokens already answered 429 or 5xx once.
    let failedOnce = Mutex<Set<String>>([])

    func reject(_ reason: String) { stats.withLock { if $0.rejected.count < 100 { $0.rejected.append(reason) } } }
    func refused(_ token: String) { stats.withLock { $0.refusals[token, default: 0] += 1 } }
    /// Whether a `busy` or `flaky` token fails now (the first time only).
    func failsNow(_ token: String, prefix: String) -> Bool {
        guard token.hasPrefix(prefix) else { return false }
        return failedOnce.withLock { $0.insert(token).inserted }
    }
}

/// A request's context, knowing whether it came over HTTP/2 (APNs takes nothing else).
struct FixtureContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    let overHTTP2: Bool

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        overHTTP2 = String(describing: type(of: source.channel)).contains("HTTP2")
    }
}

struct APNsClaims: JWTPayload {
    var iss: IssuerClaim
    var iat: IssuedAtClaim
    func verify(using algorithm: some JWTAlgorithm) throws {}
}

struct AssertionClaims: JWTPayload {
    var iss: IssuerClaim
    var scope: String
    var aud: AudienceClaim
    var iat: IssuedAtClaim
    var exp: ExpirationClaim
    func verify(using algorithm: some JWTAlgorithm) throws {}
}

struct Account: Decodable {
    var project_id: String
    var client_email: String
    var private_key: String
}

@main
struct PushFixture: Sendable {
    let port: Int
    let apnsKeys: JWTKeyCollection
    let apnsKeyId: String
    let apnsTeamId: String
    let apnsTopic: String
    let fcmKeys: JWTKeyCollection
    let account: Account
    let state = State()
    var tokenURI: String { "https://127.0.0.1:\(port)/token" }

    static func main() async throws {
        let environment = ProcessInfo.processInfo.environment
        guard let port = environment["FIXTURE_PORT"].flatMap(Int.init), let caFile = environment["FIXTURE_CA_FILE"],
              let apnsKeyFile = environment["FIXTURE_APNS_KEY_FILE"], let accountFile = environment["FIXTURE_FCM_ACCOUNT_FILE"] else {
            FileHandle.standardError.write(Data("FIXTURE_PORT, FIXTURE_CA_FILE, FIXTURE_APNS_KEY_FILE and FIXTURE_FCM_ACCOUNT_FILE are required\n".utf8))
            exit(2)
        }
        let apnsKeyId = environment["FIXTURE_APNS_KEY_ID"] ?? "KEY0000001"
        let apnsKeys = JWTKeyCollection()
        await apnsKeys.add(ecdsa: try ES256PrivateKey(pem: try String(contentsOfFile: apnsKeyFile, encoding: .utf8)).publicKey, kid: JWKIdentifier(string: apnsKeyId))
        let account = try JSONDecoder().decode(Account.self, from: try Data(contentsOf: URL(fileURLWithPath: accountFile)))
        let fcmKeys = JWTKeyCollection()
        await fcmKeys.add(rsa: try Insecure.RSA.PrivateKey(pem: account.private_key).publicKey, digestAlgorithm: .sha256)
        let fixture = PushFixture(
            port: port, apnsKeys: apnsKeys, apnsKeyId: apnsKeyId, apnsTeamId: environment["FIXTURE_APNS_TEAM_ID"] ?? "TEAM000001",
            apnsTopic: environment["FIXTURE_APNS_TOPIC"] ?? "com.example.photoedit", fcmKeys: fcmKeys, account: account
        )
        try await fixture.run(caFile: caFile)
    }

    /// A certificate for 127.0.0.1 and localhost, its own authority, and its key.
    static func certificate() throws -> (certificate: String, key: String) {
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName { CommonName("push-fixture") }
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(7 * 86_400),
            issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(digitalSignature: true, keyCertSign: true))
                SubjectAlternativeNames([.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))])
            },
            issuerPrivateKey: .init(key)
        )
        return (try certificate.serializeAsPEM().pemString, key.pemRepresentation)
    }

    func run(caFile: String) async throws {
        let (certificate, key) = try Self.certificate()
        try Data(certificate.utf8).write(to: URL(fileURLWithPath: caFile))
        let tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(certificate.utf8), format: .pem))],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(key.utf8), format: .pem))
        )
        let router = Router(context: FixtureContext.self)
        router.post("/3/device/:token") { request, context in
            guard context.overHTTP2 else {
                state.reject("apns: not over HTTP/2 (APNs takes HTTP/2 only)")
                return Response(status: .badRequest)
            }
            return try await apns(request, token: try context.parameters.require("token"))
        }
        router.post("/token") { request, _ in try await grant(request) }
        router.post("/v1/projects/:project/:call") { request, context in
            try await fcm(request, project: try context.parameters.require("project"), call: try context.parameters.require("call"))
        }
        router.get("/_fixture/stats") { _, _ in
            let stats = state.stats.withLock { $0 }
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: try JSONEncoder().encode(stats))))
        }
        var logger = Logger(label: "push-fixture")
        logger.logLevel = .warning
        let app = Application(
            router: router, server: try .http2Upgrade(tlsConfiguration: tls),
            configuration: .init(address: .hostname("127.0.0.1", port: port)), logger: logger
        )
        print("push-fixture listening on \(port)")
        try await app.runService()
    }

    static func json(_ status: HTTPResponse.Status, _ object: Any, headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        let data = (try? JSONSerialization.data(withJSONObject: object)) ?? Data()
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    // MARK: APNs

    func apns(_ request: Request, token: String) async throws -> Response {
        func reason(_ status: HTTPResponse.Status, _ reason: String) -> Response { Self.json(status, ["reason": reason]) }
        guard let authorization = request.headers[.authorization], authorization.hasPrefix("bearer ") else {
            state.reject("apns: no bearer provider token")
            return reason(.forbidden, "MissingProviderToken")
        }
        let jwt = String(authorization.dropFirst("bearer ".count))
        guard let claims = try? await apnsKeys.verify(jwt, as: APNsClaims.self), claims.iss.value == apnsTeamId,
              abs(claims.iat.value.timeIntervalSinceNow) < 3600, Self.kid(of: jwt) == apnsKeyId else {
            state.reject("apns: a provider token not signed by the team's key, or not naming it")
            return reason(.forbidden, "InvalidProviderToken")
        }
        guard request.headers[HTTPField.Name("apns-topic")!] == apnsTopic else {
            state.reject("apns: apns-topic is not the app's bundle id")
            return reason(.badRequest, "BadTopic")
        }
        guard request.headers[HTTPField.Name("apns-push-type")!] == "alert" else {
            state.reject("apns: apns-push-type is not alert")
            return reason(.badRequest, "InvalidPushType")
        }
        let body = try await request.body.collect(upTo: 8 << 10)
        guard body.readableBytes <= 4096, let payload = try? JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any],
              let aps = payload["aps"] as? [String: Any], aps["alert"] != nil,
              let jobId = payload["jobId"] as? String, let status = payload["status"] as? String else {
            state.reject("apns: the payload needs aps.alert, and the job's id and status")
            return reason(.badRequest, "PayloadEmpty")
        }
        if token.hasPrefix("gone") {
            state.refused(token)
            return Self.json(.gone, ["reason": "Unregistered", "timestamp": Int(Date().timeIntervalSince1970 * 1000)])
        }
        if state.failsNow(token, prefix: "busy") {
            state.refused(token)
            return reason(.tooManyRequests, "TooManyRequests")
        }
        if state.failsNow(token, prefix: "flaky") {
            state.refused(token)
            return reason(.internalServerError, "InternalServerError")
        }
        state.stats.withLock {
            $0.deliveries.append(Delivery(platform: "apns", token: token, jobId: jobId, status: status,
                                          collapseId: request.headers[HTTPField.Name("apns-collapse-id")!]))
        }
        return Response(status: .ok, headers: [HTTPField.Name("apns-id")!: UUID().uuidString])
    }

    /// The `kid` of a JWT's header.
    static func kid(of jwt: String) -> String? {
        guard let header = jwt.split(separator: ".").first else { return nil }
        var text = header.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let data = Data(base64Encoded: text), let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        return object["kid"] as? String
    }

    // MARK: FCM

    func grant(_ request: Request) async throws -> Response {
        let body = String(buffer: try await request.body.collect(upTo: 16 << 10))
        var form: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
            if parts.count == 2 { form[parts[0]] = parts[1] }
        }
        guard form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer", let assertion = form["assertion"] else {
            state.reject("oauth: not a jwt-bearer grant")
            return Self.json(.badRequest, ["error": "unsupported_grant_type", "error_description": "Invalid grant_type: "])
        }
        guard let claims = try? await fcmKeys.verify(assertion, as: AssertionClaims.self), claims.iss.value == account.client_email,
              claims.aud.value.contains(tokenURI), claims.scope.split(separator: " ").contains("https://www.googleapis.com/auth/firebase.messaging"),
              claims.exp.value.timeIntervalSince(claims.iat.value) <= 3600 else {
            state.reject("oauth: an assertion not signed by the service account, or with the wrong iss, aud, scope or lifetime")
            return Self.json(.badRequest, ["error": "invalid_grant", "error_description": "Invalid JWT Signature."])
        }
        let token = "ya29.fixture-" + UUID().uuidString
        state.accessTokens.withLock { _ = $0.insert(token) }
        state.stats.withLock { $0.tokenGrants += 1 }
        return Self.json(.ok, ["access_token": token, "expires_in": 3599, "token_type": "Bearer"])
    }

    static func googleError(_ code: Int, _ status: String, _ message: String, fcm: String? = nil) -> Response {
        var error: [String: Any] = ["code": code, "message": message, "status": status]
        if let fcm { error["details"] = [["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": fcm]] }
        return json(.init(code: code), ["error": error])
    }

    func fcm(_ request: Request, project: String, call: String) async throws -> Response {
        guard call == "messages:send", project == account.project_id else {
            state.reject("fcm: path is not /v1/projects/{the account's project}/messages:send")
            return Self.googleError(404, "NOT_FOUND", "Requested entity was not found.")
        }
        guard let authorization = request.headers[.authorization], authorization.hasPrefix("Bearer "),
              state.accessTokens.withLock({ $0.contains(String(authorization.dropFirst("Bearer ".count))) }) else {
            state.reject("fcm: no access token of ours")
            return Self.googleError(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        }
        let body = try await request.body.collect(upTo: 8 << 10)
        guard let object = try? JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any],
              let message = object["message"] as? [String: Any], let token = message["token"] as? String,
              let data = message["data"] as? [String: String], let jobId = data["jobId"], let status = data["status"] else {
            state.reject("fcm: the message needs a token and data with the job's id and status (data values are strings)")
            return Self.googleError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.", fcm: "INVALID_ARGUMENT")
        }
        if token.hasPrefix("gone") {
            state.refused(token)
            return Self.googleError(404, "NOT_FOUND", "Requested entity was not found.", fcm: "UNREGISTERED")
        }
        if state.failsNow(token, prefix: "busy") {
            state.refused(token)
            return Self.googleError(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", fcm: "QUOTA_EXCEEDED")
        }
        if state.failsNow(token, prefix: "flaky") {
            state.refused(token)
            return Self.googleError(503, "UNAVAILABLE", "The service is currently unavailable.", fcm: "UNAVAILABLE")
        }
        let collapse = (message["android"] as? [String: Any])?["collapse_key"] as? String
        state.stats.withLock { $0.deliveries.append(Delivery(platform: "fcm", token: token, jobId: jobId, status: status, collapseId: collapse)) }
        return Self.json(.ok, ["name": "projects/\(project)/messages/\(UUID().uuidString)"])
    }
}
