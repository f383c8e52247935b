import Blobs
import Crypto
import Foundation
import HTTPTypes
import Logging
import Metrics

/// What the gateway's own upload route checked, checked again where every store can: at job
/// creation, from one ranged `GET` of the header bytes, which also names the object's version
/// (its `ETag` in an object store). With the S3 store the app's `PUT` never reaches the gateway,
/// so this is where type, size, pixels and owner are enforced; a refused object is deleted. The
/// job is pinned to the version checked (`CreateJob.imageETag`): a client that uploads without
/// `If-None-Match` may PUT to its URL again until it expires, and a job's input is then read
/// only as the version checked, or the job fails with its credits back. A version that passed
/// is remembered for a minute: in the folder store by key (written once), in an object store by
/// key and `ETag`, which a `HEAD` reads at every creation.
struct UploadCheck: Sendable {
    let blobs: any BlobStore
    let maxBytes: Int
    let maxPixels: Int
    let passed = BlobMetadataCache<BlobMetadata>()

    /// The upload `key` as `caller` may use it (its `etag` the version checked), or the problem
    /// the gateway's upload would have answered (404 for a key that is not the caller's or holds
    /// nothing). With `version` (a re-run: the version its job was created from), 409 if the
    /// key holds another version now.
    func verify(_ key: String, of caller: Caller, version: String? = nil) async throws -> BlobMetadata {
        guard BlobKey.isValid(key), key.hasPrefix("uploads/\(Self.ownerFolder(caller.id))/") else {
            throw Self.notFound(key)
        }
        var remembered = key
        if blobs.kind == .s3 {
            guard let now = try await blobs.head(key) else { throw Self.notFound(key) }
            if let etag = now.etag { remembered += "\n" + etag }
        }
        let checked = try await passed.value(of: remembered) { () -> BlobMetadata? in
            let metadata: BlobMetadata, head: [UInt8]
            do {
                let read = try await blobs.read(key, range: 0...(UploadProblems.headerBytes - 1), limit: UploadProblems.headerBytes)
                (metadata, head) = (read.metadata, Array(read.bytes.readableBytesView))
            } catch BlobError.notFound {
                return nil
            }
            do {
                try check(key, metadata, head: head)
            } catch let problem as Problem {
                // Refused: the object goes, so nothing refused is ever processed or kept.
                try? await blobs.delete(key)
                Counter(label: "gateway_uploads_refused_total", dimensions: [("reason", problem.extensions["code"].flatMap { if case .string(let code) = $0 { code } else { nil } } ?? "refused")]).increment()
                throw problem
            }
            return metadata
        }
        guard let checked, checked.owner.isEmpty || checked.owner == caller.id else { throw Self.notFound(key) }
        if let version, let now = checked.etag, now != version {
            throw Problem(.conflict, detail: "The image \(key.prefix(100)) was replaced after the job was created; upload it again and start a new edit.",
                          extensions: ["code": .string("image_replaced")])
        }
        return checked
    }

    /// Size (of the whole object), type and pixels, from the header bytes read.
    func check(_ key: String, _ metadata: BlobMetadata, head: [UInt8]) throws {
        guard metadata.size <= maxBytes else { throw UploadProblems.tooLarge(maxBytes) }
        let claimed = key.split(separator: ".").last.flatMap { ext in ImageSniffer.accepted.first { $0.value == ext }?.key } ?? ""
        guard let sniffed = ImageSniffer.contentType(of: Array(head.prefix(16))), sniffed == claimed else {
            throw UploadProblems.notAnImage(claimed)
        }
        try UploadProblems.checkPixels(head, contentType: claimed, maxPixels: maxPixels)
    }

    static func notFound(_ key: String) -> Problem {
        Problem(.notFound, detail: "No uploaded image \(key.prefix(100)).")
    }

    /// A user's upload folder: a hash, so ids never become paths and a key names its owner.
    static func ownerFolder(_ owner: String) -> String {
        SigV4.hex(SHA256.hash(data: Data(owner.utf8)).prefix(8))
    }
}

/// The problems an upload is refused with, the same from the gateway's upload route and from the
/// check at job creation.
enum UploadProblems {
    /// Every image header the gateway reads lies in the first 256 KiB.
    static let headerBytes = 256 << 10
    /// The largest output a worker may write through the folder store's `PUT /files/...`.
    static let maxOutputBytes = 64 << 20
    /// The largest body the gateway takes in memory rather than streaming it to a staging file.
    static let inMemoryBodyLimit = 1 << 20

    static func tooLarge(_ maxBytes: Int) -> Problem {
        Problem(.contentTooLarge, detail: "Uploads are limited to \(maxBytes) bytes.",
                extensions: ["code": .string("upload_too_large"), "maxBytes": .int(maxBytes)])
    }

    static func notAnImage(_ contentType: String) -> Problem {
        Problem(.unsupportedMediaType, detail: "The bytes are not a \(contentType.isEmpty ? "supported" : contentType) image.",
                extensions: ["code": .string("not_an_image")])
    }

    /// Refuses an image whose header does not say its size, or says more than `maxPixels`.
    static func checkPixels(_ head: [UInt8], contentType: String, maxPixels: Int) throws {
        guard let size = ImageSize.read(head, contentType: contentType) else {
            throw Problem(.unprocessableContent, detail: "The image's width and height cannot be read from its header.",
                          extensions: ["code": .string("unreadable_image_size")])
        }
        guard size.width > 0, size.height > 0, size.pixels <= maxPixels else {
            throw Problem(
                .unprocessableContent,
                detail: "The image is \(size) (\(size.pixels) pixels); images are limited to \(maxPixels) pixels.",
                extensions: ["code": .string("too_many_pixels"), "maxPixels": .int(maxPixels), "width": .int(size.width), "height": .int(size.height)]
            )
        }
    }
}
