import Blobs
import Foundation
import Synchronization

/// Expiring download URLs of blobs (results, thumbnails), as clients reach them: presigned URLs
/// of the object store (or its public/CDN base), or the gateway's signed `/files` route with the
/// folder store.
///
/// A URL is signed as of the start of the current minute (`step`) and expires `lifetime + step`
/// seconds after that: valid for at least `lifetime` seconds from now and at most a minute more.
/// So a blob has one URL for a whole minute, whoever asks and however often:
/// - the app's image cache, which keys by URL, finds a thumbnail it loaded a moment ago when a
///   history page is shown again, instead of loading it anew under a fresh signature;
/// - the gateway signs each blob once a minute, not once per response (`SignedURLs`, bounded).
///   Signing was 14% of the machine serving history pages (perf, `make bench-history`), and a
///   presigned S3 URL costs more than the folder store's.
struct DownloadLinks: Sendable {
    let blobs: any BlobStore
    /// The gateway's address as clients reach it (share links point at it).
    let publicBaseURL: String
    /// Seconds a URL stays valid at least.
    let lifetime: Int
    /// Seconds one signing of a blob is handed out for.
    let step: Int
    private let signed: SignedURLs

    init(blobs: any BlobStore, publicBaseURL: String, lifetime: Int, step: Int = 60, capacity: Int = 100_000) {
        self.blobs = blobs
        self.publicBaseURL = publicBaseURL
        self.lifetime = lifetime
        self.step = max(1, step)
        signed = SignedURLs(capacity: capacity)
    }

    /// The URL of `key`; nil when there is no key.
    func url(_ key: String?, now: Date = Date()) -> String? {
        guard let key else { return nil }
        let seconds = Int(now.timeIntervalSince1970.rounded(.down))
        let window = seconds >= 0 ? seconds / step : (seconds - step + 1) / step
        if let url = signed.url(of: key, in: window) { return url }
        let signedAt = Date(timeIntervalSince1970: Double(window * step))
        let url = blobs.presignedGET(key, expiresIn: lifetime + step, now: signedAt)
        signed.remember(url, of: key, in: window)
        return url
    }
}

/// The URLs signed in the current window, by blob key: at most `capacity` (emptied when full),
/// all forgotten when the window moves on.
final class SignedURLs: Sendable {
    private let capacity: Int
    private let state = Mutex<(window: Int, urls: [String: String])>((Int.min, [:]))

    init(capacity: Int) { self.capacity = max(1, capacity) }

    func url(of key: String, in window: Int) -> String? {
        state.withLock { $0.window == window ? $0.urls[key] : nil }
    }

    func remember(_ url: String, of key: String, in window: Int) {
        state.withLock { state in
            if window != state.window {
                // A request that read the clock just before the window moved does not turn it back.
                guard window > state.window else { return }
                state = (window, [:])
            }
            if state.urls.count >= capacity { state.urls.removeAll(keepingCapacity: true) }
            state.urls[key] = url
        }
    }

    /// How many URLs are remembered (for tests).
    var count: Int { state.withLock { $0.urls.count } }
}
