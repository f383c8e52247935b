import Blobs
import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Messages
import Metrics
import Synchronization

/// Uploads through presigned, expiring URLs: the object store's own with the S3 store (the app's
/// `PUT` never reaches the gateway; the checks run at job creation), or the gateway's signed
/// `PUT /api/v1/uploads/...` with the folder store. With the folder store the gateway also serves
/// the signed `GET /files/...` downloads and takes the workers' signed `PUT /files/...` outputs.
struct UploadsController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let blobs: any BlobStore
    let signer: URLSigner
    let maxBytes: Int
    let maxPixels: Int
    let lifetime: Int
    /// Logs a failing store once, not once per upload.
    let failures: FailureLog
    /// Refuse a presign with the quota 429 when the user has no edit left (the app's "blocks at 0").
    let requireQuota: Bool
    /// The bytes of bodies being taken in memory, for all requests at once (`receive`).
    let inMemory = ByteBudget(bytes: 64 << 20)

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
        router.authenticated(by: authenticator).post("/api/v1/uploads/presigned") { request, context in
            let caller = context.caller
            let ask = try await JSONBody.decode(PresignRequest.self, from: request, context: context)
            // Counted as JSON Schema counts a maxLength (code points); the name is never a path.
            guard (1...255).contains(ask.filename.unicodeScalars.count) else {
                throw Problem(.badRequest, detail: "filename must be 1 to 255 characters")
            }
            guard let ext = ImageSniffer.accepted[ask.contentType] else {
                throw Problem(.unsupportedMediaType, detail: "Uploads must be image/jpeg, image/png, image/webp or image/heic.")
            }
            if requireQuota {
                let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
                if let denial = RateLimitHeaders.problem(ifExhausted: status, now: Date()) { throw denial }
            }
            // A new key every time: a key holds one image for good, so a job's original never changes.
            let key = "uploads/\(UploadCheck.ownerFolder(caller.id))/\(UUID().uuidString.lowercased()).\(ext)"
            let put = blobs.presignedPUT(key, contentType: ask.contentType, owner: caller.id, expiresIn: lifetime, now: Date())
            return try JSONResponse.make(.ok, Presigned(uploadUrl: put.url, imageKey: key, expiresIn: lifetime, headers: put.headers))
        }
        guard let folder = blobs as? FolderBlobStore else { return }
        router.put("/api/v1/uploads/**") { request, context in
            try await upload(request, context: context, folder: folder)
        }
        router.get("/files/**") { request, context in
            try await download(request, context: context)
        }
        router.put("/files/**") { request, context in
            try await storeOutput(request, context: context, folder: folder)
        }
    }

    /// Checks signature and expiry (403), type (415), a declared size over the limit (413, before
    /// reading the body), that the key holds nothing yet (409), then streams the body into a
    /// staging file (413 as soon as it passes the limit), checks the bytes are the signed type
    /// (415) and the header's pixel count (422), and puts the file in under the key, once.
    /// Nothing is left behind on any refusal; a full disk answers 507.
    func upload(_ request: Request, context: Context, folder: FolderBlobStore) async throws -> Response {
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
            throw UploadProblems.tooLarge(maxBytes)
        }
        guard try await storing({ try await folder.head(key) }) == nil else { throw Self.alreadyUploaded }
        let (received, counter) = try await receive(request, limit: maxBytes, into: folder, context: context)
        return try await consuming(received, of: folder) {
            try await adopt(received.source, counter: counter, as: key, owner: owner, contentType: contentType, into: folder)
        }
    }

    /// The checks of a received upload's bytes, then the put, once.
    func adopt(_ source: BlobSource, counter: ByteCounter, as key: String, owner: String, contentType: String, into folder: FolderBlobStore) async throws -> Response {
        let head = counter.head
        guard let sniffed = ImageSniffer.contentType(of: Array(head.prefix(16))), sniffed == contentType else {
            throw UploadProblems.notAnImage(contentType)
        }
        try UploadProblems.checkPixels(head, contentType: contentType, maxPixels: maxPixels)
        let size = ImageSize.read(head, contentType: contentType) ?? ImageSize(width: 0, height: 0)
        do {
            try await folder.put(key, from: source, metadata: BlobMetadata(owner: owner, contentType: contentType), ifAbsent: true)
        } catch BlobError.exists {
            throw Self.alreadyUploaded
        } catch {
            throw storageProblem(error) ?? error
        }
        return try JSONResponse.make(.created, Uploaded(imageKey: key, size: counter.count, contentType: contentType, width: size.width, height: size.height))
    }

    /// A worker's output (folder store): `PUT /files/<key>?owner=&exp=&sig=` signed by the jobs
    /// service with the same secret, for that key, owner and content type.
    func storeOutput(_ request: Request, context: Context, folder: FolderBlobStore) async throws -> Response {
        let key = context.parameters.getCatchAll().joined(separator: "/")
        let query = request.uri.queryParameters
        let owner = query["owner"].map { String($0).removingPercentEncoding ?? "" } ?? ""
        let contentType = request.headers[.contentType] ?? ""
        guard BlobKey.isValid(key), !key.hasPrefix("uploads/"), let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
              signer.verify(signature: sig, method: URLSigner.writeMethod, key: key, owner: owner, contentType: contentType, expires: expires)
        else {
            throw Problem(.forbidden, detail: "The write URL is invalid or has expired (or Content-Type differs from the one signed).")
        }
        let (received, _) = try await receive(request, limit: UploadProblems.maxOutputBytes, into: folder, context: context)
        return try await consuming(received, of: folder) {
            do {
                try await folder.put(key, from: received.source, metadata: BlobMetadata(owner: owner, contentType: contentType))
            } catch {
                throw storageProblem(error) ?? error
            }
            return Response(status: .created)
        }
    }

    /// A request body as received: in memory, or in a staging file of the store.
    enum Received {
        /// The bytes, holding `bytes` of the gateway's in-memory budget until `consuming` ends.
        case memory(ByteBuffer, bytes: Int)
        case file(URL)

        var source: BlobSource {
            switch self {
            case .memory(let buffer, _): .bytes(buffer)
            case .file(let url): .file(url)
            }
        }
    }

    /// Runs `body`, then lets go of what was received, whether `body` throws or not: the memory
    /// goes back to the budget; the staging file is removed (off the cooperative pool).
    func consuming(_ received: Received, of folder: FolderBlobStore, _ body: () async throws -> Response) async throws -> Response {
        func release() async {
            switch received {
            case .memory(_, let bytes): inMemory.give(bytes)
            case .file(let staged): await folder.discard(staged)
            }
        }
        do {
            let response = try await body()
            await release()
            return response
        } catch {
            await release()
            throw error
        }
    }

    /// Receives a request body (413 past `limit`); a client that goes away meanwhile is a client
    /// abort, not a storage failure. A body that says by its Content-Length that it is at most
    /// `UploadProblems.inMemoryBodyLimit` (a worker's output, most often: a thumbnail, an edited photo) is taken
    /// in memory while the gateway's budget for such bodies lasts, and then stored in one
    /// blocking call; any other is streamed into a staging file, a blocking call per part and
    /// three more to open, close and remove it, which cost more than the writing for a small
    /// file (docs/jobs.md).
    func receive(_ request: Request, limit: Int, into folder: FolderBlobStore, context: Context) async throws -> (Received, ByteCounter) {
        let counter = ByteCounter()
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length <= min(limit, UploadProblems.inMemoryBodyLimit), inMemory.take(length) {
            var buffer = ByteBuffer()
            buffer.reserveCapacity(length)
            do {
                for try await part in LimitedBody(base: request.body, limit: limit, counter: counter) { buffer.writeImmutableBuffer(part) }
            } catch {
                inMemory.give(length)
                throw receiveFailure(error, counter: counter, limit: limit, context: context)
            }
            return (.memory(buffer, bytes: length), counter)
        }
        let staged = folder.stagingFile()
        do {
            try await FileIO().writeFile(contents: LimitedBody(base: request.body, limit: limit, counter: counter), path: staged.path, context: context)
        } catch {
            await folder.discard(staged)
            throw receiveFailure(error, counter: counter, limit: limit, context: context)
        }
        return (.file(staged), counter)
    }

    /// What a failed receive answers.
    func receiveFailure(_ error: any Error, counter: ByteCounter, limit: Int, context: Context) -> any Error {
        // The limit is checked on the bytes received, whatever error the file writer wrapped it in.
        if counter.count > limit { return UploadProblems.tooLarge(limit) }
        if !counter.finished, !StorageErrors.isOutOfSpace(error) {
            // The body ended early: the client went away (or sent less than it said).
            Counter(label: "gateway_uploads_aborted_total").increment()
            context.logger.debug("upload abandoned by the client", metadata: ["received": "\(counter.count)", "error": "\(error)"])
            return Problem(.badRequest, detail: "The upload ended before its body did.", extensions: ["code": .string("upload_incomplete")])
        }
        return storageProblem(error) ?? error
    }

    static var alreadyUploaded: Problem { Problem(
        .conflict, detail: "This upload URL has been used: an upload key holds one image for good. Ask for a new upload URL.",
        extensions: ["code": .string("already_uploaded")]
    ) }

    /// Runs store work, turning a store failure into its problem.
    func storing<T>(_ work: () async throws -> T) async throws -> T {
        do { return try await work() } catch { throw storageProblem(error) ?? error }
    }

    /// The answer to a failed write, through the gateway's one mapping of storage errors (507 for
    /// a full disk, 503 for another I/O error); the cause is logged once, not per upload.
    func storageProblem(_ error: any Error) -> Problem? {
        let storage: BusError
        if StorageErrors.isOutOfSpace(error) || (error as? BlobStoreError)?.kind == .full {
            storage = BusError(.storageFull, "The server's disk is full; the upload was not stored. Try again later.")
        } else if error is CocoaError || error is POSIXError || error is BlobStoreError || "\(type(of: error))".contains("FileSystemError") {
            storage = BusError(.storageUnavailable, "The server could not store the upload. Try again shortly.")
        } else {
            return nil
        }
        failures.record(storage.code.rawValue, "uploads cannot be stored: \(error)")
        return Problem(storage, service: "gateway")
    }

    /// `GET /files/<key>?exp=&sig=` (folder store): the file is opened before the answer starts,
    /// so a blob deleted meanwhile is served whole, or is 404 if it was gone first.
    func download(_ request: Request, context: Context) async throws -> Response {
        let key = context.parameters.getCatchAll().joined(separator: "/")
        let query = request.uri.queryParameters
        guard BlobKey.isValid(key), let expires = query["exp"].flatMap({ Int($0) }), let sig = query["sig"].map(String.init),
              signer.verify(signature: sig, method: "GET", key: key, owner: "", contentType: "", expires: expires)
        else {
            throw Problem(.forbidden, detail: "The file URL is invalid or has expired.")
        }
        return try await Self.serve(blobs, key: key, cacheControl: "private, max-age=\(lifetime)")
    }

    /// The whole of `key` as a response, streamed from a reader opened before it starts.
    static func serve(_ blobs: any BlobStore, key: String, cacheControl: String) async throws -> Response {
        let reader: BlobReader
        do {
            reader = try await blobs.open(key)
        } catch BlobError.notFound {
            throw Problem(.notFound, detail: "No such file.")
        }
        return Response(
            status: .ok,
            headers: [.contentType: reader.metadata.contentType, .contentLength: String(reader.length), .cacheControl: cacheControl],
            body: ResponseBody(asyncSequence: reader.body)
        )
    }
}

/// An upload went past its size limit.
struct UploadTooLarge: Error {}

/// A count of bytes shared by all requests: taken while it lasts, given back after.
final class ByteBudget: Sendable {
    private let left: Mutex<Int>

    init(bytes: Int) { left = Mutex(bytes) }

    /// Takes `bytes` if that many are left.
    func take(_ bytes: Int) -> Bool {
        left.withLock { left in
            guard bytes <= left else { return false }
            left -= bytes
            return true
        }
    }

    func give(_ bytes: Int) { left.withLock { $0 += bytes } }
}

struct Uploaded: Encodable {
    var imageKey: String
    var size: Int
    var contentType: String
    var width: Int
    var height: Int
}

/// Counts the bytes an upload streamed and keeps its first 256 KiB, where every image header
/// the gateway reads lies (so the file is not read back), and whether the body ended.
final class ByteCounter: @unchecked Sendable {
    // Written by the one task that streams the body, read after it finished.
    var count = 0
    var head: [UInt8] = []
    var finished = false

    func add(_ buffer: ByteBuffer) {
        count += buffer.readableBytes
        if head.count < UploadProblems.headerBytes {
            head += buffer.readableBytesView.prefix(UploadProblems.headerBytes - head.count)
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
            guard let buffer = try await base.next() else {
                counter.finished = true
                return nil
            }
            counter.add(buffer)
            if counter.count > limit { throw UploadTooLarge() }
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), limit: limit, counter: counter)
    }
}
