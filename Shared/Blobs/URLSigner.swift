import Crypto
import Foundation
import Messages

/// Signs and checks the expiring URLs of uploads and downloads: HMAC-SHA256 over the method, the
/// blob key, the owner, the content type and the expiry, keyed by `URL_SIGNING_SECRET`.
public struct URLSigner: Sendable {
    /// HMAC-SHA256 with the key's pads already absorbed: each signature copies it and hashes
    /// only its message (two compression rounds fewer than keying afresh).
    private let keyed: Keyed

    private final class Keyed: Sendable {
        let mac: HMAC<SHA256>
        init(_ key: SymmetricKey) { mac = HMAC<SHA256>(key: key) }
    }
    /// The method of a grant to write a job's output through the folder store's `PUT /files/...`
    /// (an upload's grant is `PUT`, so one cannot stand for the other).
    public static let writeMethod = "WRITE"

    public init(secret: String) {
        keyed = Keyed(SymmetricKey(data: Data(secret.utf8)))
    }

    /// The signature (base64url, no padding) of one grant.
    public func signature(method: String, key blobKey: String, owner: String, contentType: String, expires: Int) -> String {
        var mac = keyed.mac
        var message: [UInt8] = []
        message.reserveCapacity(method.utf8.count + blobKey.utf8.count + owner.utf8.count + contentType.utf8.count + 24)
        for part in [method, blobKey, owner, contentType] {
            message += part.utf8
            message.append(UInt8(ascii: "\n"))
        }
        message += String(expires).utf8
        mac.update(data: message)
        return Base64URL.encode(Array(mac.finalize()))
    }

    /// Whether `signature` is this signer's for the grant, and the grant has not expired at `now`.
    public func verify(signature: String, method: String, key blobKey: String, owner: String, contentType: String, expires: Int, now: Date = Date()) -> Bool {
        guard expires >= Int(now.timeIntervalSince1970) else { return false }
        let expected = self.signature(method: method, key: blobKey, owner: owner, contentType: contentType, expires: expires)
        guard expected.utf8.count == signature.utf8.count else { return false }
        return zip(expected.utf8, signature.utf8).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }

    /// A signed download path: `/files/<key>?exp=...&sig=...`, valid for `lifetime` seconds.
    public func downloadPath(for blobKey: String, lifetime: Int = 900, now: Date = Date()) -> String {
        let expires = Int(now.timeIntervalSince1970) + lifetime
        let sig = signature(method: "GET", key: blobKey, owner: "", contentType: "", expires: expires)
        return "/files/\(blobKey)?exp=\(expires)&sig=\(sig)"
    }
}

extension URLSigner: CustomStringConvertible {
    /// Names the type only: a signer never prints its key (a service group describes its services
    /// in its log lines).
    public var description: String { "URLSigner" }
}

/// What a file really is, from its first bytes.
public enum ImageSniffer {
    /// The image type of `bytes` (`image/jpeg`, `image/png`, `image/webp`, `image/heic`), or nil.
    public static func contentType(of bytes: [UInt8]) -> String? {
        if bytes.starts(with: [0xFF, 0xD8, 0xFF]) { return "image/jpeg" }
        if bytes.starts(with: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) { return "image/png" }
        if bytes.count >= 12, bytes.starts(with: Array("RIFF".utf8)), Array(bytes[8..<12]) == Array("WEBP".utf8) { return "image/webp" }
        if bytes.count >= 12, Array(bytes[4..<8]) == Array("ftyp".utf8) {
            let brand = String(decoding: bytes[8..<12], as: UTF8.self)
            if ["heic", "heix", "hevc", "heim", "heis", "mif1", "msf1"].contains(brand) { return "image/heic" }
        }
        return nil
    }

    /// The upload types accepted, with their file extensions.
    public static let accepted: [String: String] = [
        "image/jpeg": "jpg", "image/png": "png", "image/webp": "webp", "image/heic": "heic",
    ]
}
