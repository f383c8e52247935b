import Blobs
import Foundation
import Messages

/// Signs the URLs a worker needs for one attempt: a GET of its input and a PUT for its result
/// and its thumbnail, each under the key the output is to have. The jobs service holds the
/// store's credentials; a worker holds none and needs no shared disk.
public struct TransferSigner: Sendable {
    let blobs: any BlobStore
    /// Seconds the URLs stay valid (`JOBS_TRANSFER_TTL_S`); a worker whose URLs expired while the
    /// job waited asks for fresh ones.
    let lifetime: Int
    /// Signs the providers' webhook URLs (nil: no webhooks; the workers poll).
    let webhooks: WebhookSigner?

    public init(blobs: any BlobStore, lifetime: Int = 3600, webhooks: WebhookSigner? = nil) {
        self.blobs = blobs
        self.lifetime = lifetime
        self.webhooks = webhooks
    }

    /// The URLs of `attempt` of a job on `imageKey` running `effect`, for `userId`. A video's
    /// result is an MP4; an image's a JPEG (a copy keeps its input's type).
    public func transfer(_ attempt: JobAttempt, userId: String, imageKey: String, effect: EffectDescription, now: Date = Date()) -> JobTransfer {
        let inputExtension = imageKey.split(separator: ".").last.map { $0.lowercased() } ?? "jpg"
        let resultExtension = effect.kind == .video ? "mp4" : effect.processor == "copy" && Self.types[inputExtension] != nil ? inputExtension : "jpg"
        let resultKey = "results/\(attempt.jobId)/\(attempt.attempt).\(resultExtension)"
        let thumbnailKey = "thumbnails/\(attempt.jobId)/\(attempt.attempt).jpg"
        func write(_ key: String, _ type: String) -> PresignedWrite {
            let put = blobs.presignedPUT(key, contentType: type, owner: userId, expiresIn: lifetime, now: now)
            return PresignedWrite(key: key, url: put.url, headers: put.headers)
        }
        return JobTransfer(
            inputURL: blobs.presignedGET(imageKey, expiresIn: lifetime, now: now),
            result: write(resultKey, Self.types[resultExtension] ?? "image/jpeg"),
            thumbnail: write(thumbnailKey, "image/jpeg"),
            expiresAt: now.addingTimeInterval(TimeInterval(lifetime))
        )
    }

    /// The assignment with its URLs signed (none for `noop`, which reads and writes nothing).
    public func signed(_ job: JobAssignment, now: Date = Date()) -> JobAssignment {
        guard job.effect.processor != "noop" else { return job }
        var signed = job
        signed.transfer = transfer(job.attempt, userId: job.userId, imageKey: job.imageKey, effect: job.effect, now: now)
        if job.effect.processor == "fal", let webhooks {
            signed.callbackURL = webhooks.url(provider: "fal", jobId: job.attempt.jobId, now: now)
        }
        return signed
    }

    static let types = ["jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heic": "image/heic", "mp4": "video/mp4"]
}
