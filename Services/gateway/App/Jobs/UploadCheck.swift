import Blobs
import Crypto
import Foundation
import HTTPTypes
import Logging
import Metrics

/// What the gateway's own upload route checked, checked again where every store can: at job
/// creation, from a `HEAD` and a ranged `GET` of the header bytes. With the S3 store the app's
/// `PUT` never reaches the gateway, so this is where type, size, pixels and owner are enforced;
/// a refused object is deleted. A key that passed is remembered for a minute (a blob never
/// changes: keys are written once).
struct UploadCheck: Sendable {
    let blobs: any BlobStore
    let maxBytes: Int
    let maxPixels: Int
    let passed = BlobMetadataCache<BlobMetadata>()

    /// The upload `key` as `caller` may use it, or the problem the gateway's upload would have
    /// answered (404 for a key that is not the caller's or holds nothing).
    func verify(_ key: String, of caller: Caller) async throws -> BlobMetadata {
        guard BlobKey.isValid(key), key.hasPrefix("uploads/\(Self.ownerFolder(caller.id))/") else {
            throw Self.notFound(key)
        }
        let checked = try await passed.value(of: key) { () -> BlobMetadata? in
            guard let metadata = try await blobs.head(key) else { return nil }
            do {
                try await check(key, metadata)
            } catch let problem as Problem {
                // Refused: the object goes, so nothing refused is ever processed or kept.
                try? await blobs.delete(key)
                Counter(label: "gateway_uploads_refused_total", dimensions: [("reason", problem.extensions["code"].flatMap { if case .string(let code) = $0 { code } else { nil } } ?? "refused")]).increment()
                throw problem
            }
            return metadata
        }
        guard let checked, checked.owner.isEmpty || checked.owner == caller.id else { throw Self.notFound(key) }
        return checked
    }

    func check(_ key: String, _ metadata: BlobMetadata) async throws {
        guard metadata.size <= maxBytes else { throw UploadProblems.tooLarge(maxBytes) }
        let claimed = key.split(separator: ".").last.flatMap { ext in ImageSniffer.accepted.first { $0.value == ext }?.key } ?? ""
        let head: [UInt8]
        do {
            head = Array(try await blobs.bytes(of: key, range: 0...(UploadProblems.headerBytes - 1), limit: UploadProblems.headerBytes).readableBytesView)
        } catch BlobError.notFound {
            throw Self.notFound(key)
        }
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
