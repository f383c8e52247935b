import AsyncHTTPClient
import Blobs
import Crypto
import Foundation
import HTTPTypes
import Messages
import NIOCore
import Synchronization

/// fal's own signature on its webhooks, checked as fal's documentation says ("Webhooks",
/// "Verifying your webhook", docs.fal.ai):
/// - the headers `X-Fal-Webhook-Request-Id`, `X-Fal-Webhook-User-Id`, `X-Fal-Webhook-Timestamp`
///   (Unix seconds) and `X-Fal-Webhook-Signature` (hex);
/// - the message is the request id, the user id, the timestamp and the hex SHA-256 of the raw
///   body, joined by `\n`, as UTF-8;
/// - the signature is ED25519, by any key of fal's JWKS (`keys[].x`, the public key in base64url;
///   fal's JWKS is seen with and without `=` padding), cached at most 24 hours;
/// - a timestamp more than 5 minutes from now is refused.
///
/// fal's headers name no key id, so "an unknown key" is a signature no cached key verifies: then
/// the key set is fetched again (fal rotated its key), at most once a minute, so that forged
/// webhooks cannot make the gateway hammer fal's JWKS. One fetch runs at a time; the webhooks
/// that arrive meanwhile wait for it instead of fetching too.
///
/// A signature already accepted is remembered for the timestamp's window (10 minutes, at most
/// `rememberedLimit` of them): the same delivery again is a replay, taken without effect.
public final class FalWebhookSignature: Sendable {
    /// What a delivery's check found.
    public enum Verdict: Equatable, Sendable {
        /// Signed by fal, now, and not seen before: the request id fal signed.
        case valid(requestId: String)
        /// Signed by fal and already accepted once.
        case replayed
        /// Not fal's: a missing header, a bad signature, a timestamp too far off.
        case refused(String)
        /// fal's keys could not be had, so nothing can be checked now (fal retries).
        case unavailable(String)
    }

    struct Cache {
        var keys: [Curve25519.Signing.PublicKey] = []
        var fetchedAt: ContinuousClock.Instant?
        var lastAttempt: ContinuousClock.Instant?
        var fetching = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        /// Accepted signatures, by when they may be forgotten.
        var seen: [String: ContinuousClock.Instant] = [:]
    }

    public static let defaultJWKSURL = "https://rest.alpha.fal.ai/.well-known/jwks.json"
    static let keyLifetime: Duration = .seconds(86_400)
    static let skew: TimeInterval = 300
    static let rememberedLimit = 100_000

    let jwksURL: String
    /// The least time between two fetches of the keys once some are held.
    let refetchInterval: Duration
    let cache = Mutex(Cache())

    public init(jwksURL: String, refetchInterval: Duration = .seconds(60)) {
        self.jwksURL = jwksURL
        self.refetchInterval = refetchInterval
    }

    /// Checks one delivery; `now` is the wall clock the timestamp is compared with.
    public func verify(headers: HTTPFields, body: ByteBuffer, now: Date = Date()) async -> Verdict {
        func header(_ name: String) -> String? { HTTPField.Name(name).flatMap { headers[$0] } }
        guard let requestId = header("X-Fal-Webhook-Request-Id"), let userId = header("X-Fal-Webhook-User-Id"),
              let timestamp = header("X-Fal-Webhook-Timestamp"), let signatureHex = header("X-Fal-Webhook-Signature") else {
            return .refused("the X-Fal-Webhook-* signature headers are missing")
        }
        guard let seconds = Int(timestamp) else { return .refused("the timestamp is not a number") }
        guard abs(now.timeIntervalSince1970 - TimeInterval(seconds)) <= Self.skew else {
            return .refused("the timestamp is more than 5 minutes from now")
        }
        guard let signature = Self.bytes(hex: signatureHex), signature.count == 64 else { return .refused("the signature is not 64 bytes of hex") }
        let digest = SigV4.payloadHash(body.readableBytesView)
        let message = Data([requestId, userId, timestamp, digest].joined(separator: "\n").utf8)

        var keys = await currentKeys(refresh: false)
        if keys == nil || !(keys ?? []).contains(where: { $0.isValidSignature(signature, for: message) }) {
            // No key, or none of ours verifies: fal may have rotated its key.
            keys = await currentKeys(refresh: true) ?? keys
        }
        guard let keys, !keys.isEmpty else { return .unavailable("fal's webhook keys could not be fetched from \(jwksURL)") }
        guard keys.contains(where: { $0.isValidSignature(signature, for: message) }) else {
            return .refused("the signature is not fal's")
        }
        let clock = ContinuousClock.now
        let fresh = cache.withLock { cache -> Bool in
            if cache.seen.count >= Self.rememberedLimit { cache.seen = cache.seen.filter { $0.value > clock } }
            if cache.seen.count >= Self.rememberedLimit, let oldest = cache.seen.min(by: { $0.value < $1.value }) {
                cache.seen[oldest.key] = nil
            }
            guard cache.seen[signatureHex.lowercased()].map({ $0 <= clock }) ?? true else { return false }
            cache.seen[signatureHex.lowercased()] = clock.advanced(by: .seconds(2 * Self.skew))
            return true
        }
        return fresh ? .valid(requestId: requestId) : .replayed
    }

    /// The cached keys, fetched first when there are none, when they are a day old, or when
    /// `refresh` asks and the last fetch is a minute old. Nil: none could be had.
    func currentKeys(refresh: Bool) async -> [Curve25519.Signing.PublicKey]? {
        enum Step { case use([Curve25519.Signing.PublicKey]?), fetch, wait }
        while true {
            let now = ContinuousClock.now
            let step = cache.withLock { cache -> Step in
                let stale = cache.fetchedAt.map { now - $0 > Self.keyLifetime } ?? true
                let mayFetch = cache.lastAttempt.map { now - $0 > (cache.keys.isEmpty ? .seconds(5) : refetchInterval) } ?? true
                let held = cache.keys.isEmpty ? nil : cache.keys
                guard stale || refresh else { return .use(held) }
                // A fetch under way is waited for, whoever started it.
                if cache.fetching { return .wait }
                guard mayFetch else { return .use(held) }
                cache.fetching = true
                cache.lastAttempt = now
                return .fetch
            }
            switch step {
            case .use(let keys):
                return keys
            case .wait:
                await withCheckedContinuation { continuation in
                    let resumeNow = cache.withLock { cache -> Bool in
                        guard cache.fetching else { return true }
                        cache.waiters.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
                return cache.withLock { $0.keys.isEmpty ? nil : $0.keys }
            case .fetch:
                let fetched = await fetchKeys()
                let waiters = cache.withLock { cache -> [CheckedContinuation<Void, Never>] in
                    if let fetched {
                        cache.keys = fetched
                        cache.fetchedAt = now
                    }
                    cache.fetching = false
                    defer { cache.waiters = [] }
                    return cache.waiters
                }
                for waiter in waiters { waiter.resume() }
                return cache.withLock { $0.keys.isEmpty ? nil : $0.keys }
            }
        }
    }

    struct JWKS: Decodable {
        struct Key: Decodable {
            var kty: String?
            var crv: String?
            var x: String?
        }
        var keys: [Key]
    }

    /// fal's ED25519 keys from the JWKS URL; nil when it cannot be fetched or read.
    func fetchKeys() async -> [Curve25519.Signing.PublicKey]? {
        do {
            let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: jwksURL), timeout: .seconds(5))
            let body = try await response.body.collect(upTo: 256 << 10)
            guard response.status == .ok else { return nil }
            let jwks = try JSONDecoder().decode(JWKS.self, from: body)
            let keys = jwks.keys.compactMap { key -> Curve25519.Signing.PublicKey? in
                guard key.kty == nil || key.kty == "OKP", key.crv == nil || key.crv == "Ed25519",
                      let x = key.x, let raw = Base64URL.decode(x) else { return nil }
                return try? Curve25519.Signing.PublicKey(rawRepresentation: raw)
            }
            return keys.isEmpty ? nil : keys
        } catch {
            return nil
        }
    }

    static func bytes(hex: String) -> Data? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var data = Data(capacity: digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = nibble(digits[index]), let low = nibble(digits[index + 1]) else { return nil }
            data.append(high << 4 | low)
            index += 2
        }
        return data
    }

    static func nibble(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
