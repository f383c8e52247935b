import Blobs
import Bus
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// Uploads through signed, expiring URLs that point at the gateway's own `PUT` route, and
/// downloads of results and thumbnails through signed, expiring `GET` URLs.
struct UploadsController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let blobs: DiskBlobStore
    let signer: URLSigner
    let publicBaseURL: String
    let maxBytes: Int
    let maxPixels: Int
    let lifetime: Int
    /// Logs a full disk once, not once per upload.
    let failures: FailureLog
    /// Refuse a presign with the quota 429 when the user has no edit left (the app's "blocks at 0").
    let requireQuota: Bool

    struct PresignRequest: Decodable {
        var filename: String
        var contentType: String
    }

    struct Presigned: Encodable {
        var uploadUrl: String
        var imageKey: String
        var expiresIn: Int
        var method = "PUT"
        var headers: [String: String]
    }

    func addRoutes(to router: Router<Context>) {
        router.post("/api/v1/uploads/presigned") { request, context in
            let caller = try await authenticator.caller(of: request)
            let ask = try await JSONBody.decode(PresignRequest.self, from: request, context: context)
            guard (1...255).contains(ask.filename.utf8.count) else {
                throw Problem(.badRequest, detail: "filename must be 1 to 255 bytes")
            }
            guard let ext = ImageSniffer.accepted[ask.contentType] else {
                throw Problem(.unsupportedMediaType, detail: "Uploads must be image/jpeg, image/png, image/webp or image/heic.")
            }
            if requireQuota {
                let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
                if let denial = RateLimitHeaders.problem(ifExhausted: status, now: Date()) { throw denial }
            }
            let key = "uploads/\(Self.ownerFolder(caller.id))/\(UUID().uuidString.lowercased()).\(ext)"
            let expires = Int(Date().timeIntervalSince1970) + lifetime
            let sig = signer.signature(method: "PUT", key: key, owner: caller.id, contentType: ask.contentType, expires: expires)
            let owner = caller.id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            return try JSONResponse.make(.ok, Presigned(
                uploadUrl: "\(publicBaseURL)/api/v1/uploads/\(key)?owner=\(owner)&exp=\(expires)&sig=\(sig)",
                imageKey: key, expiresIn: lifetime, headers: ["Content-Type": ask.contentType]
            ))
        }
        router.put("/api/v1/uploads/**") { request, context in
            try await upload(request, context: context)
        }
        router.get("/files/**") { request, context in
            try await download(request, context: context)
        }
    }

    /// Checks signature and expiry (403), type (415), a declared size over the limit (413, before
    /// reading the body), that the key holds nothing yet (409), then streams the body into a
    /// temporary file (413 as soon as it passes the limit), checks the bytes are the signed type
    /// (415) and the header's pixel count (422), and moves the file in under the key, once.
    /// Nothing is left behind on any refusal; a full disk answers 507.
    func upload(_ request: Request, context: Context) async throws -> Response {
        let key = context.parameters.getCatchAll().joined(separator: "/")
        let query = request.uri.queryParameters
        let owner = query["owner"].map { String($0).removingPercentEncoding ?? "" } ?? ""
        let contentType = request.headers[.contentType] ?? ""
        guard BlobKey.isValid(key), key.hasPrefix("uploads/"), let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
              signer.verify(signature: sig, method: "PUT", key: key, owner: owner, contentType: contentType, expires: expires)
        else {
            throw Problem(.forbidden, detail: "The upload URL is invalid or has expired (or Content-Type differs from the one signed).")
        }
        guard ImageSniffer.accepted[contentType] != nil else {
            throw Problem(.unsupportedMediaType, detail: "Uploads must be image/jpeg, image/png, image/webp or image/heic.")
        }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > maxBytes {
            throw Self.tooLarge(maxBytes)
        }
        guard try !blobs.exists(key) else { throw Self.alreadyUploaded }
        let temporary = try storing { try blobs.temporaryFile() }
        defer { try? FileManager.default.removeItem(at: temporary) }
        let counter = ByteCounter()
        do {
            try await FileIO().writeFile(contents: LimitedBody(base: request.body, limit: maxBytes, counter: counter), path: temporary.path, context: context)
        } catch {
            // The limit is checked on the bytes received, whatever error the file writer wrapped it in.
            if counter.count > maxBytes { throw Self.tooLarge(maxBytes) }
            throw storageProblem(error) ?? error
        }
        let head = counter.head
        guard let sniffed = ImageSniffer.contentType(of: Array(head.prefix(16))), sniffed == contentType else {
            throw Problem(.unsupportedMediaType, detail: "The bytes are not a \(contentType) image.")
        }
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
        do {
            try await blobs.adoptOnce(file: temporary, as: key, metadata: BlobMetadata(owner: owner, contentType: contentType, size: counter.count))
        } catch BlobError.exists {
            throw Self.alreadyUploaded
        } catch {
            throw storageProblem(error) ?? error
        }
        return try JSONResponse.make(.created, Uploaded(imageKey: key, size: counter.count, contentType: contentType, width: size.width, height: size.height))
    }

    static func tooLarge(_ maxBytes: Int) -> Problem {
        Problem(.contentTooLarge, detail: "Uploads are limited to \(maxBytes) bytes.",
                extensions: ["code": .string("upload_too_large"), "maxBytes": .int(maxBytes)])
    }

    static var alreadyUploaded: Problem { Problem(
        .conflict, detail: "This upload URL has been used: an upload key holds one image for good. Ask for a new upload URL.",
        extensions: ["code": .string("already_uploaded")]
    ) }

    /// Runs file work, turning a full disk into its problem.
    func storing<T>(_ work: () throws -> T) throws -> T {
        do { return try work() } catch { throw storageProblem(error) ?? error }
    }

    /// The answer to a failed file write, through the gateway's one mapping of storage errors
    /// (507 for a full disk, 503 for another I/O error); the cause is logged once, not per upload.
    func storageProblem(_ error: any Error) -> Problem? {
        let storage: BusError
        if StorageErrors.isOutOfSpace(error) {
            storage = BusError(.storageFull, "The server's disk is full; the upload was not stored. Try again later.")
        } else if error is CocoaError || error is POSIXError || "\(type(of: error))".contains("FileSystemError") {
            storage = BusError(.storageUnavailable, "The server could not store the upload. Try again shortly.")
        } else {
            return nil
        }
        failures.record(storage.code.rawValue, "uploads cannot be stored: \(error)")
        return Problem(storage, service: "gateway")
    }

    func download(_ request: Request, context: Context) async throws -> Response {
        let key = context.parameters.getCatchAll().joined(separator: "/")
        let query = request.uri.queryParameters
        guard BlobKey.isValid(key), let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
              signer.verify(signature: sig, method: "GET", key: key, owner: "", contentType: "", expires: expires)
        else {
            throw Problem(.forbidden, detail: "The file URL is invalid or has expired.")
        }
        guard let metadata = try await blobs.metadata(of: key), let file = try? await blobs.localFile(for: key) else {
            throw Problem(.notFound, detail: "No such file.")
        }
        let body = try await FileIO().loadFile(path: file.path, context: context)
        return Response(status: .ok, headers: [.contentType: metadata.contentType, .cacheControl: "private, max-age=\(lifetime)"], body: body)
    }

    /// A user's upload folder: a hash, so ids never become paths.
    static func ownerFolder(_ owner: String) -> String {
        SHA256.hash(data: Data(owner.utf8)).prefix(8).map { String(format: "%02x", $0) }.joined()
    }
}

/// An upload went past its size limit.
struct UploadTooLarge: Error {}

struct Uploaded: Encodable {
    var imageKey: String
    var size: Int
    var contentType: String
    var width: Int
    var height: Int
}

/// Counts the bytes an upload streamed and keeps its first 256 KiB, where every image header
/// the gateway reads lies (so the file is not read back).
final class ByteCounter: @unchecked Sendable {
    // Written by the one task that streams the body, read after it finished.
    static let headBytes = 256 << 10
    var count = 0
    var head: [UInt8] = []

    func add(_ buffer: ByteBuffer) {
        count += buffer.readableBytes
        if head.count < Self.headBytes {
            head += buffer.readableBytesView.prefix(Self.headBytes - head.count)
        }
    }
}

/// A request body that throws once more than `limit` bytes have arrived.
struct LimitedBody<Base: AsyncSequence & Sendable>: AsyncSequence, Sendable where Base.Element == ByteBuffer {
    typealias Element = ByteBuffer
    let base: Base
    let limit: Int
    let counter: ByteCounter

    struct AsyncIterator: AsyncIteratorProtocol {
        var base: Base.AsyncIterator
        let limit: Int
        let counter: ByteCounter
        mutating func next() async throws -> ByteBuffer? {
            guard let buffer = try await base.next() else { return nil }
            counter.add(buffer)
            if counter.count > limit { throw UploadTooLarge() }
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), limit: limit, counter: counter)
    }
}
