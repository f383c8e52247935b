import Blobs
import Foundation

/// Signed, expiring download URLs of blobs (results, thumbnails), as clients reach the gateway.
struct DownloadLinks: Sendable {
    let signer: URLSigner
    let publicBaseURL: String
    /// Seconds a URL stays valid.
    let lifetime: Int

    /// The URL of `key`; nil when there is no key.
    func url(_ key: String?) -> String? {
        key.map { publicBaseURL + signer.downloadPath(for: $0, lifetime: lifetime) }
    }
}
