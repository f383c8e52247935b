import Foundation
import NIOCore

/// Where uploads, results and thumbnails live, by key (`uploads/<owner>/<id>.jpg`): a folder
/// (`FolderBlobStore`, the embedded default) or an S3-compatible bucket (`S3BlobStore`). Every
/// consumer holds `any BlobStore`; no call blocks the cooperative pool.
public protocol BlobStore: Sendable {
    /// What kind of store this is (`folder` or `s3`): what the app's URLs point at.
    var kind: BlobStoreKind { get }
    /// Stores `source` under `key` with `metadata` (its `size` is taken from the bytes). With
    /// `ifAbsent`, `BlobError.exists` if `key` holds something already (of two writers exactly
    /// one wins).
    func put(_ key: String, from source: BlobSource, metadata: BlobMetadata, ifAbsent: Bool) async throws
    /// Opens `key` for reading, the whole blob or `range` of its bytes: `BlobError.notFound` if
    /// there is none. The reader's body streams; once opened, a delete does not cut it short.
    func open(_ key: String, range: ClosedRange<Int>?) async throws -> BlobReader
    /// The metadata of `key`, nil if there is no such blob.
    func head(_ key: String) async throws -> BlobMetadata?
    /// Removes `key`; no error if it is not there.
    func delete(_ key: String) async throws
    /// Keys under `prefix` last written before `date`, at most `limit` of them.
    func list(prefix: String, modifiedBefore date: Date, limit: Int) async throws -> [String]
    /// A URL that reads `key` without credentials until `expiresIn` seconds after `now`.
    func presignedGET(_ key: String, expiresIn: Int, now: Date) -> String
    /// A request that writes `key` without credentials until `expiresIn` seconds after `now`:
    /// the URL and the headers the client must send as they are (only the signed content type).
    /// A client may add `If-None-Match: *` to write the key once: an object store honours it
    /// (412 when the key holds an object), and the gateway's own upload route writes once always.
    func presignedPUT(_ key: String, contentType: String, owner: String, expiresIn: Int, now: Date) -> PresignedRequest
}

extension BlobStore {
    public func put(_ key: String, from source: BlobSource, metadata: BlobMetadata) async throws {
        try await put(key, from: source, metadata: metadata, ifAbsent: false)
    }

    public func open(_ key: String) async throws -> BlobReader { try await open(key, range: nil) }

    /// The whole of `key`, read into memory (at most `limit` bytes).
    public func bytes(of key: String, range: ClosedRange<Int>? = nil, limit: Int = 64 << 20) async throws -> ByteBuffer {
        try await read(key, range: range, limit: limit).bytes
    }

    /// `key` (or `range` of it) read into memory (at most `limit` bytes), with the metadata of
    /// the very version read: its whole size, owner and `etag`.
    public func read(_ key: String, range: ClosedRange<Int>? = nil, limit: Int = 64 << 20) async throws -> (metadata: BlobMetadata, bytes: ByteBuffer) {
        let reader = try await open(key, range: range)
        var collected = ByteBuffer()
        for try await var chunk in reader.body {
            guard collected.readableBytes + chunk.readableBytes <= limit else { throw BlobError.tooLarge }
            collected.writeBuffer(&chunk)
        }
        return (reader.metadata, collected)
    }
}

/// The two kinds of store.
public enum BlobStoreKind: String, Sendable {
    /// A folder on this machine; the gateway serves and takes its bytes through signed routes.
    case folder
    /// An S3-compatible bucket; the app and the workers reach it through presigned URLs.
    case s3
}

/// What `put` stores.
public enum BlobSource: Sendable {
    /// The bytes of a local file, handed over: it is left where it is, but the folder store
    /// makes the blob a link to it when it can (one file system, no copy) and puts the blob's
    /// metadata on it, so the caller neither changes nor reuses it (a staged upload).
    case file(URL)
    /// Bytes in memory.
    case bytes(ByteBuffer)
}

/// A presigned write: the URL, its method, and the headers to send with it as they are.
public struct PresignedRequest: Sendable, Equatable {
    public var url: String
    public var method: String
    public var headers: [String: String]

    public init(url: String, method: String = "PUT", headers: [String: String]) {
        self.url = url
        self.method = method
        self.headers = headers
    }
}

/// An opened blob: its metadata (`size` is the whole blob's), the range served, and its bytes.
public struct BlobReader: Sendable {
    public var metadata: BlobMetadata
    /// The bytes served, when a range was asked for and the blob has them.
    public var range: ClosedRange<Int>?
    /// How many bytes `body` yields.
    public var length: Int
    public var body: BlobBody

    public init(metadata: BlobMetadata, range: ClosedRange<Int>?, length: Int, body: BlobBody) {
        self.metadata = metadata
        self.range = range
        self.length = length
        self.body = body
    }
}

/// A blob's bytes as they arrive, chunk by chunk; iterated once.
public struct BlobBody: AsyncSequence, Sendable {
    public typealias Element = ByteBuffer
    let next: @Sendable () async throws -> ByteBuffer?

    /// A body whose chunks come from `next` until it answers nil.
    public init(next: @escaping @Sendable () async throws -> ByteBuffer?) {
        self.next = next
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let next: @Sendable () async throws -> ByteBuffer?
        public mutating func next() async throws -> ByteBuffer? { try await next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(next: next) }
}

/// What is known of a blob: who owns it, its type and size, when it was written.
public struct BlobMetadata: Codable, Sendable, Equatable {
    public var owner: String
    public var contentType: String
    public var size: Int
    public var createdAt: Date
    /// The version of the bytes read, where the store names one (an object store's `ETag`; nil
    /// in the folder store, whose keys are written once): a read conditional on it
    /// (`If-Match`) reads these bytes or fails with 412.
    public var etag: String?

    public init(owner: String, contentType: String, size: Int = 0, createdAt: Date = Date(), etag: String? = nil) {
        self.owner = owner
        self.contentType = contentType
        self.size = size
        self.createdAt = createdAt
        self.etag = etag
    }
}

/// A blob store problem of the caller's: a key that is not a key, a blob that is not there, one
/// that is there already when it may be written once only, or one larger than asked for.
public enum BlobError: Error, Equatable {
    case invalidKey
    case notFound
    case exists
    case tooLarge
}

/// The store itself failed: unreachable or answering errors (`unavailable`, 503 to the app),
/// out of space (`full`, 507), or refusing our credentials or bucket (`misconfigured`, 503 and
/// an operator's problem). The message names no secret.
public struct BlobStoreError: Error, CustomStringConvertible, Equatable {
    public enum Kind: String, Sendable { case unavailable, full, misconfigured }
    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { "blob store \(kind.rawValue): \(message)" }
}

/// Blob keys: 1 to 256 characters of `[A-Za-z0-9._/-]`, no empty, `.` or `..` segments.
public enum BlobKey {
    public static func isValid(_ key: String) -> Bool {
        guard (1...256).contains(key.utf8.count) else { return false }
        let allowed = key.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2E || byte == 0x5F || byte == 0x2F || byte == 0x2D
        }
        guard allowed else { return false }
        return key.split(separator: "/", omittingEmptySubsequences: false).allSatisfy { !$0.isEmpty && $0 != "." && $0 != ".." }
    }
}
