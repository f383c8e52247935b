import Foundation
import Synchronization

/// Where uploads, results and thumbnails live, by key (`uploads/<owner>/<id>.jpg`). The disk store
/// is the one that ships; an S3 store can implement the same protocol.
public protocol BlobStore: Sendable {
    /// Moves the file at `source` into the store under `key`, with `metadata` beside it.
    func adopt(file source: URL, as key: String, metadata: BlobMetadata) async throws
    /// The metadata of `key`, nil if there is no such blob.
    func metadata(of key: String) async throws -> BlobMetadata?
    /// A local file holding `key`'s bytes (the disk store's own file; a remote store downloads).
    func localFile(for key: String) async throws -> URL
    /// Removes `key`; no error if it is not there.
    func delete(_ key: String) async throws
}

/// What is known of a blob: who owns it, its type and size.
public struct BlobMetadata: Codable, Sendable, Equatable {
    public var owner: String
    public var contentType: String
    public var size: Int
    public var createdAt: Date

    public init(owner: String, contentType: String, size: Int, createdAt: Date = Date()) {
        self.owner = owner
        self.contentType = contentType
        self.size = size
        self.createdAt = createdAt
    }
}

/// A blob store problem: a key that is not a key, a blob that is not there, or one that is there
/// already when it may be written once only.
public enum BlobError: Error, Equatable {
    case invalidKey
    case notFound
    case exists
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

/// Blobs as files under a folder, metadata in a `.meta.json` file beside each.
public struct DiskBlobStore: BlobStore {
    public let root: URL

    public init(root: URL) throws {
        self.root = root
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    }

    func path(_ key: String) throws -> URL {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        return root.appendingPathComponent(key)
    }

    public func adopt(file source: URL, as key: String, metadata: BlobMetadata) async throws {
        let target = try path(key)
        try FileManager.default.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
        _ = try? FileManager.default.removeItem(at: target)
        try FileManager.default.moveItem(at: source, to: target)
        try Self.metadataData(metadata).write(to: target.appendingPathExtension("meta.json"), options: .atomic)
    }

    /// Moves the file at `source` in under `key` only if `key` holds nothing yet (a hard link
    /// made exclusively, so of two writers exactly one wins): `BlobError.exists` otherwise, and
    /// `source` is left for the caller to remove. The metadata follows the link; until it is
    /// written the blob reads as absent.
    public func adoptOnce(file source: URL, as key: String, metadata: BlobMetadata) async throws {
        let target = try path(key)
        try FileManager.default.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
        guard link(source.path, target.path) == 0 else {
            let code = errno
            if code == EEXIST { throw BlobError.exists }
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        do {
            try Self.metadataData(metadata).write(to: target.appendingPathExtension("meta.json"), options: .atomic)
        } catch {
            try? FileManager.default.removeItem(at: target)
            throw error
        }
        try? FileManager.default.removeItem(at: source)
    }

    /// Whether `key` holds a blob.
    public func exists(_ key: String) throws -> Bool {
        FileManager.default.fileExists(atPath: try path(key).path)
    }

    static func metadataData(_ metadata: BlobMetadata) throws -> Data {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        return try encoder.encode(metadata)
    }

    public func metadata(of key: String) async throws -> BlobMetadata? {
        let target = try path(key)
        guard let data = try? Data(contentsOf: target.appendingPathExtension("meta.json")) else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try? decoder.decode(BlobMetadata.self, from: data)
    }

    public func localFile(for key: String) async throws -> URL {
        let target = try path(key)
        guard FileManager.default.fileExists(atPath: target.path) else { throw BlobError.notFound }
        return target
    }

    public func delete(_ key: String) async throws {
        let target = try path(key)
        try? FileManager.default.removeItem(at: target)
        try? FileManager.default.removeItem(at: target.appendingPathExtension("meta.json"))
    }

    /// A fresh temporary file in the store's own file system, so `adopt` is a rename.
    public func temporaryFile() throws -> URL {
        let folder = root.appendingPathComponent(".incoming")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        return folder.appendingPathComponent(UUID().uuidString)
    }
}

/// Blob metadata remembered for `lifetime`, so a hot path (every job creation checks its upload's
/// owner) does not read a file each time. A blob's owner, type and size never change while it
/// exists; what the lifetime bounds is how long a deleted blob still looks present (a job created
/// on it then fails when the worker finds no image). Absent blobs are not remembered. At most
/// `capacity` entries; past it the cache starts over.
public final class BlobMetadataCache: Sendable {
    private let store: any BlobStore
    private let lifetime: Duration
    private let capacity: Int
    private let now: @Sendable () -> ContinuousClock.Instant
    private let entries = Mutex<[String: (metadata: BlobMetadata, until: ContinuousClock.Instant)]>([:])

    public init(
        store: any BlobStore, lifetime: Duration = .seconds(60), capacity: Int = 10_000,
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.store = store
        self.lifetime = lifetime
        self.capacity = capacity
        self.now = now
    }

    /// The metadata of `key`, from memory if read within the lifetime.
    public func metadata(of key: String) async throws -> BlobMetadata? {
        let now = now()
        if let hit = entries.withLock({ $0[key] }), now < hit.until { return hit.metadata }
        guard let metadata = try await store.metadata(of: key) else { return nil }
        entries.withLock { entries in
            if entries.count >= capacity { entries.removeAll(keepingCapacity: true) }
            entries[key] = (metadata, now.advanced(by: lifetime))
        }
        return metadata
    }
}
