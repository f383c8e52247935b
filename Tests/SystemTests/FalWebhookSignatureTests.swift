import Crypto
import Foundation
@testable import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Synchronization
import Testing

/// fal's webhook signatures, checked against a JWKS served on a real socket in fal's shape
/// (docs.fal.ai, "Webhooks", "Verifying your webhook": `{"keys": [{"kty": "OKP", "crv":
/// "Ed25519", "x": <base64url>}]}`; the message is request id, user id, timestamp and the body's
/// hex SHA-256 joined by newlines; the signature is hex in `X-Fal-Webhook-Signature`).
struct FalWebhookSignatureTests {
    /// A JWKS server whose key can be swapped, counting its fetches.
    final class JWKSServer: Sendable {
        let keys = Mutex<[Curve25519.Signing.PublicKey]>([])
        let fetches = Mutex(0)
        let available = Mutex(true)
        /// fal's live JWKS pads `x` with `=`; both forms are served in turn.
        let padded = Mutex(false)

        func router() -> Router<BasicRequestContext> {
            let router = Router()
            router.get("/.well-known/jwks.json") { _, _ in
                self.fetches.withLock { $0 += 1 }
                guard self.available.withLock({ $0 }) else { return Response(status: .internalServerError) }
                let pad = self.padded.withLock { $0 }
                let entries = self.keys.withLock { $0 }.map { key -> String in
                    var x = key.rawRepresentation.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                    if !pad { x = x.replacingOccurrences(of: "=", with: "") }
                    return #"{"kty": "OKP", "crv": "Ed25519", "x": "\#(x)"}"#
                }
                let body = #"{"keys": [\#(entries.joined(separator: ", "))]}"#
                return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
            }
            return router
        }
    }

    /// fal's headers for `body`, signed by `key` at `timestamp`.
    static func delivery(_ body: String, key: Curve25519.Signing.PrivateKey, requestId: String = "req-1", timestamp: Date = Date()) throws -> HTTPFields {
        let seconds = String(Int(timestamp.timeIntervalSince1970))
        let digest = SHA256.hash(data: Data(body.utf8)).map { String(format: "%02x", $0) }.joined()
        let message = Data([requestId, "fal-user", seconds, digest].joined(separator: "\n").utf8)
        let signature = try key.signature(for: message).map { String(format: "%02x", $0) }.joined()
        return [
            HTTPField.Name("X-Fal-Webhook-Request-Id")!: requestId, HTTPField.Name("X-Fal-Webhook-User-Id")!: "fal-user",
            HTTPField.Name("X-Fal-Webhook-Timestamp")!: seconds, HTTPField.Name("X-Fal-Webhook-Signature")!: signature,
        ]
    }

    @Test func validForgedReplayedOldAndRotatedDeliveries() async throws {
        let server = JWKSServer()
        let falKey = Curve25519.Signing.PrivateKey()
        server.keys.withLock { $0 = [falKey.publicKey] }
        let app = Application(router: server.router())
        try await app.test(.live) { client in
            let url = "http://127.0.0.1:\(client.port!)/.well-known/jwks.json"
            let verifier = FalWebhookSignature(jwksURL: url, refetchInterval: .seconds(3600))
            let body = #"{"request_id": "req-1", "status": "OK", "payload": {}}"#

            // Deliveries at once on a verifier with no keys yet: one fetch, and both wait for it
            let fresh = FalWebhookSignature(jwksURL: url, refetchInterval: .seconds(3600))
            let (a, b) = (try Self.delivery(body, key: falKey, requestId: "a"), try Self.delivery(body, key: falKey, requestId: "b"))
            async let first = fresh.verify(headers: a, body: ByteBuffer(string: body))
            async let second = fresh.verify(headers: b, body: ByteBuffer(string: body))
            let both = await [first, second]
            #expect(both == [.valid(requestId: "a"), .valid(requestId: "b")])
            #expect(server.fetches.withLock { $0 } == 1)
            server.fetches.withLock { $0 = 0 }

            // Valid: the request id fal signed
            let delivered = try Self.delivery(body, key: falKey)
            #expect(await verifier.verify(headers: delivered, body: ByteBuffer(string: body)) == .valid(requestId: "req-1"))
            // The same delivery again (the same headers, so the same timestamp): a replay
            #expect(await verifier.verify(headers: delivered, body: ByteBuffer(string: body)) == .replayed)
            // The body changed under the signature
            let other = #"{"request_id": "req-1", "status": "OK", "payload": {"video": {"url": "http://evil"}}}"#
            guard case .refused = await verifier.verify(headers: try Self.delivery(body, key: falKey, requestId: "req-2"), body: ByteBuffer(string: other)) else {
                Issue.record("a changed body was taken"); return
            }
            // Signed by a key that is not fal's
            let forger = Curve25519.Signing.PrivateKey()
            guard case .refused = await verifier.verify(headers: try Self.delivery(body, key: forger, requestId: "req-3"), body: ByteBuffer(string: body)) else {
                Issue.record("a forged signature was taken"); return
            }
            // Old and future timestamps (more than 5 minutes off), against a clock passed in: on
            // the wall's, a second spent between signing and checking on a busy machine made a
            // timestamp 301 s ahead 300 s ahead, and it was taken.
            let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
            for offset in [-301.0, 301.0] {
                let headers = try Self.delivery(body, key: falKey, requestId: "req-4", timestamp: now.addingTimeInterval(offset))
                guard case .refused = await verifier.verify(headers: headers, body: ByteBuffer(string: body), now: now) else {
                    Issue.record("a timestamp \(offset) s off was taken"); return
                }
            }
            // A missing header, a signature that is not hex
            var missing = try Self.delivery(body, key: falKey, requestId: "req-5")
            missing[HTTPField.Name("X-Fal-Webhook-User-Id")!] = nil
            guard case .refused = await verifier.verify(headers: missing, body: ByteBuffer(string: body)) else { Issue.record("no user id taken"); return }
            var garbled = try Self.delivery(body, key: falKey, requestId: "req-6")
            garbled[HTTPField.Name("X-Fal-Webhook-Signature")!] = "zz"
            guard case .refused = await verifier.verify(headers: garbled, body: ByteBuffer(string: body)) else { Issue.record("garbage taken"); return }
            // Forged deliveries do not make the gateway fetch fal's keys again and again: once at
            // the start, and at most once more within the refetch interval.
            #expect(server.fetches.withLock { $0 } <= 2)

            // fal rotates its key (published padded, as fal's live JWKS is): a verifier that
            // may fetch again takes the new key at its first unknown signature.
            let rotated = Curve25519.Signing.PrivateKey()
            server.keys.withLock { $0 = [rotated.publicKey] }
            server.padded.withLock { $0 = true }
            let eager = FalWebhookSignature(jwksURL: url, refetchInterval: .zero)
            #expect(await eager.verify(headers: try Self.delivery(body, key: falKey, requestId: "r-7"), body: ByteBuffer(string: body)) != .valid(requestId: "r-7"))
            server.keys.withLock { $0 = [falKey.publicKey, rotated.publicKey] }
            let before = server.fetches.withLock { $0 }
            #expect(await eager.verify(headers: try Self.delivery(body, key: falKey, requestId: "r-8"), body: ByteBuffer(string: body)) == .valid(requestId: "r-8"))
            #expect(server.fetches.withLock { $0 } == before + 1, "the unknown signature fetched the keys again")

            // fal's keys unreachable: nothing can be checked, and it says so
            server.available.withLock { $0 = false }
            let blind = FalWebhookSignature(jwksURL: url)
            guard case .unavailable = await blind.verify(headers: try Self.delivery(body, key: falKey, requestId: "r-9"), body: ByteBuffer(string: body)) else {
                Issue.record("a webhook was judged without keys"); return
            }
        }
    }
}
