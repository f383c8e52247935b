import AppAttest
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// Guest sign-up with Apple App Attest, so that a guest is a real install of the app:
/// - `POST /api/v1/guests/attestation/challenge` (a guest's `X-Device-Id`): a one-time challenge
///   for that device, valid for 5 minutes (`AttestationChallenges`);
/// - `POST /api/v1/guests/attestation` `{keyId, attestation, challenge}`: the app's
///   `DCAppAttestService.attestKey(keyId, clientDataHash: SHA256(challenge's UTF-8 bytes))`,
///   checked by `AppAttestVerifier` against Apple's root for `APP_ATTEST_APP_ID`. The key is then
///   bound to the guest in quota: an attested guest is admitted whatever its network's count of
///   new guests, and does not share its network's daily credits.
///
/// These two routes pass the guest admission (a real device behind a crowded carrier address
/// must be able to attest). Without `APP_ATTEST_APP_ID` both answer 404.
struct AttestationController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let networks: ClientNetworks
    let settings: AppAttestSettings?
    let challenges: AttestationChallenges
    let now: @Sendable () -> Date

    static var challengePath: String { "/api/v1/guests/attestation/challenge" }
    static var attestationPath: String { "/api/v1/guests/attestation" }

    struct ChallengeAnswer: Encodable {
        let challenge: String
        let expiresAt: Date
    }

    struct Attestation: Decodable {
        let keyId: String
        let attestation: String
        let challenge: String
    }

    struct Attested: Encodable {
        let attested: Bool
        let keyId: String
    }

    func addRoutes(to router: Router<Context>) {
        router.post(RouterPath(Self.challengePath)) { request, _ in
            let (_, userId) = try guest(request)
            let made = challenges.make(for: userId, now: now())
            return try JSONResponse.make(.ok, ChallengeAnswer(challenge: made.challenge, expiresAt: made.expiresAt))
        }
        router.post(RouterPath(Self.attestationPath)) { request, context in
            let (settings, userId) = try guest(request)
            let body = try await JSONBody.decode(Attestation.self, from: request, context: context)
            guard challenges.isValid(body.challenge, for: userId, now: now()) else {
                throw Problem(.badRequest, detail: "The challenge is unknown, for another device, or expired: ask \(Self.challengePath) for a new one.",
                              extensions: ["code": .string("invalid_challenge")])
            }
            guard let keyId = Data(base64Encoded: body.keyId).map(Array.init), keyId.count == 32 else {
                throw Problem(.badRequest, detail: "keyId must be the base64 of the 32-byte key identifier App Attest gave.")
            }
            guard body.attestation.utf8.count <= 48 << 10, let attestation = Data(base64Encoded: body.attestation).map(Array.init) else {
                throw Problem(.badRequest, detail: "attestation must be the base64 of the attestation object (at most 48 KiB of text).")
            }
            let verifier = AppAttestVerifier(appId: settings.appId, environment: settings.environment)
            do {
                _ = try await verifier.verify(attestation: attestation, keyId: keyId, challenge: Array(body.challenge.utf8), at: now())
            } catch {
                throw Problem(.unprocessableContent, title: "Attestation refused", detail: "The attestation was refused: \(error).",
                              extensions: ["code": .string("attestation_refused")])
            }
            let network = networks.network(peer: context.remoteAddress, forwardedFor: request.headers[.xForwardedFor]) ?? "local"
            let bound = try await clients.call(.quota, Quota.attestGuest, AttestGuest(userId: userId, network: network, keyId: body.keyId))
            guard bound.attested else {
                throw Problem(.conflict, detail: "This key was attested for another guest.", extensions: ["code": .string("key_in_use")])
            }
            return try JSONResponse.make(.ok, Attested(attested: true, keyId: body.keyId))
        }
    }

    /// The guest's user id (401 without a device id; a signed-in user has nothing to attest
    /// here) and the settings (then 404 without them).
    func guest(_ request: Request) throws -> (AppAttestSettings, String) {
        guard request.headers[.authorization] == nil, let device = request.headers[.deviceId], let uuid = UUID(uuidString: device) else {
            throw Problem(.unauthorized, detail: "Attestation is for guests: send X-Device-Id (a UUID) and no Authorization.")
        }
        guard let settings else { throw Problem(.notFound, detail: "App Attest is not configured on this server.") }
        return (settings, "device:\(uuid.uuidString.lowercased())")
    }
}
