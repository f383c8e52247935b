import Blobs
import Crypto
import Foundation
import HTTPTypes
import Hummingbird

/// Uploads through signed, expiring URLs that point at the gateway's own `PUT` route, and
/// downloads of results and thumbnails through signed, expiring `GET` URLs.
struct UploadsController<Context: RequestContext>: Sendable {
    let authenticator: Authenticator
    let blobs: DiskBlobStore
    let signer: URLSigner
    let publicBaseURL: String
    let maxBytes: Int
    let lifetime: Int

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

    /// Checks signature and expiry (403), type (415), size (413) and the bytes themselves (415),
    /// then streams the body into the blob store.
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
            throw Problem(.contentTooLarge, detail: "Uploads are limited to \(maxBytes) bytes.")
        }
        let temporary = try blobs.temporaryFile()
        let counter = ByteCounter()
        do {
            try await FileIO().writeFile(contents: LimitedBody(base: request.body, limit: maxBytes, counter: counter), path: temporary.path, context: context)
        } catch is UploadTooLarge {
            try? FileManager.default.removeItem(at: temporary)
            throw Problem(.contentTooLarge, detail: "Uploads are limited to \(maxBytes) bytes.")
        }
        let head = (try? FileHandle(forReadingFrom: temporary).read(upToCount: 16)) ?? nil
        guard let sniffed = head.flatMap({ ImageSniffer.contentType(of: Array($0)) }), sniffed == contentType else {
            try? FileManager.default.removeItem(at: temporary)
            throw Problem(.unsupportedMediaType, detail: "The bytes are not a \(contentType) image.")
        }
        try await blobs.adopt(file: temporary, as: key, metadata: BlobMetadata(owner: owner, contentType: contentType, size: counter.count))
        return try JSONResponse.make(.created, Uploaded(imageKey: key, size: counter.count, contentType: contentType))
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
}

/// Counts the bytes an upload streamed.
final class ByteCounter: @unchecked Sendable {
    // Written by the one task that streams the body, read after it finished.
    var count = 0
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
            counter.count += buffer.readableBytes
            if counter.count > limit { throw UploadTooLarge() }
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), limit: limit, counter: counter)
    }
}
