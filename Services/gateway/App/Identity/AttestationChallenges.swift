import Crypto
import Foundation
import Messages

/// The one-time challenges of App Attest sign-up, made and checked without state (any gateway
/// replica checks what another made): base64url of a version byte, the expiry (seconds since
/// 1970, 8 bytes), 16 random bytes, and the first 16 bytes of an HMAC-SHA256 over those and the
/// device's user id. A challenge works for that device only, until it expires; the key it
/// attests can be bound once (quota keeps which guest holds each key).
struct AttestationChallenges: Sendable {
    private let key: SymmetricKey
    /// How long a challenge works.
    let lifetime: TimeInterval

    init(secret: String, lifetime: TimeInterval = 300) {
        // A key of its own, derived from the URL signing secret: a challenge is never a valid URL
        // signature, nor the reverse.
        key = SymmetricKey(data: SHA256.hash(data: Array("photoedit app attest challenge\n\(secret)".utf8)))
        self.lifetime = lifetime
    }

    /// A new challenge for `userId`, and when it expires.
    func make(for userId: String, now: Date) -> (challenge: String, expiresAt: Date) {
        let expiresAt = Date(timeIntervalSince1970: (now.timeIntervalSince1970 + lifetime).rounded(.down))
        var body: [UInt8] = [1]
        let seconds = UInt64(expiresAt.timeIntervalSince1970)
        body += (0..<8).reversed().map { UInt8(truncatingIfNeeded: seconds >> (UInt64($0) * 8)) }
        body += (0..<16).map { _ in UInt8.random(in: 0...255) }
        return (Base64URL.encode(body + mac(body, userId)), expiresAt)
    }

    /// Whether `challenge` was made here for `userId` and has not expired.
    func isValid(_ challenge: String, for userId: String, now: Date) -> Bool {
        guard challenge.utf8.count <= 64, let bytes = Base64URL.decode(challenge).map(Array.init), bytes.count == 41, bytes[0] == 1 else { return false }
        let body = Array(bytes[0..<25])
        guard Authenticator.constantTimeEqual(Array(bytes[25...]), mac(body, userId)) else { return false }
        let seconds = body[1..<9].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return Double(seconds) > now.timeIntervalSince1970
    }

    private func mac(_ body: [UInt8], _ userId: String) -> [UInt8] {
        Array(Array(HMAC<SHA256>.authenticationCode(for: body + Array(userId.utf8), using: key)).prefix(16))
    }
}
