import Blobs
import Foundation

/// Expiring download URLs of blobs (results, thumbnails), as clients reach them: presigned URLs
/// of the object store (or its public/CDN base), or the gateway's signed `/files` route with the
/// folder store.
struct DownloadLinks: Sendable {
    let blobs: any BlobStore
    /// The gateway's address as clients reach it (share links point at it).
    let publicBaseURL: String
    /// Seconds a URL stays valid.
    let lifetime: Int

    /// The URL of `key`; nil when there is no key.
    func url(_ key: String?, now: Date = Date()) -> String? {
        key.map { blobs.presignedGET($0, expiresIn: lifetime, now: now) }
    }
}
