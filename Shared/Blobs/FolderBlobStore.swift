import CXattr
import Foundation
import NIOCore
import NIOPosix

/// Blobs as files under a folder, each one's metadata (owner, type, time) in an extended attribute
/// of its file (`user.photoedit.blob`), or, on a file system without user attributes and for
/// blobs written before they were used, in a `.meta.json` file beside it: the embedded
/// default. Its presigned URLs are the gateway's own signed routes (`PUBLIC_BASE_URL`,
/// `URL_SIGNING_SECRET`): `GET /files/<key>`, `PUT /api/v1/uploads/<key>` for the app's uploads
/// and `PUT /files/<key>` for the workers' results. Every file call runs on NIO's blocking
/// thread pool.
public struct FolderBlobStore: BlobStore {
    public let root: URL
    let signer: URLSigner
    let publicBaseURL: String
    public var kind: BlobStoreKind { .folder }

    init(root: URL, signer: URLSigner, publicBaseURL: String) {
        self.root = root
        self.signer = signer
        self.publicBaseURL = publicBaseURL
    }

    /// Opens the folder (made if missing) and checks it can be written: an error says why not.
    public static func open(root: URL, signer: URLSigner, publicBaseURL: String) async throws -> FolderBlobStore {
        let store = FolderBlobStore(root: root, signer: signer, publicBaseURL: publicBaseURL)
        try await blocking {
            let incoming = root.appendingPathComponent(".incoming")
            try FileManager.default.createDirectory(at: incoming, withIntermediateDirectories: true)
            let probe = incoming.appendingPathComponent("probe-\(UUID().uuidString)")
            try Data().write(to: probe)
            try FileManager.default.removeItem(at: probe)
        }
        return store
    }

    func path(_ key: String) throws -> URL {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        return root.appendingPathComponent(key)
    }

    /// A fresh path in the store's own file system, so that putting a file written there is a
    /// link rather than a copy.
    public func stagingFile() -> URL {
        root.appendingPathComponent(".incoming").appendingPathComponent(UUID().uuidString)
    }

    /// Removes a staging file (or anything at `file`), on the blocking pool; no error if it is gone.
    public func discard(_ file: URL) async {
        _ = try? await Self.blocking { try? FileManager.default.removeItem(at: file) }
    }

    /// The bytes go to a staging file first (a link to a staged file, or written), so the key
    /// never shows half a blob; the metadata is attached to that file, then it is linked
    /// (`ifAbsent`: of two writers exactly one wins) or renamed to the key, so the blob appears
    /// with its metadata at once. Plain system calls: this runs for every upload and every
    /// worker's output, and Foundation's file calls cost more than the writes (an fsync per
    /// atomic write, a directory walk per create); one file per blob, not two, since creating a
    /// file is what costs most here (docs/jobs.md).
    public func put(_ key: String, from source: BlobSource, metadata: BlobMetadata, ifAbsent: Bool) async throws {
        let target = try path(key)
        let staged = stagingFile()
        try await Self.blocking {
            defer { unlink(staged.path) }
            switch source {
            case .file(let file):
                if link(file.path, staged.path) != 0 { try FileManager.default.copyItem(at: file, to: staged) }
            case .bytes(let buffer):
                try Self.write(buffer, to: staged.path)
            }
            var stored = metadata
            stored.size = Self.size(staged)
            let storedData = try Self.metadataData(stored)
            let attached = try Self.attachMetadata(storedData, to: staged.path)
            if ifAbsent {
                try Self.creatingFolders(of: target) { link(staged.path, target.path) }
                guard !attached else { return }
                // Without attributes the blob reads as absent until its metadata file is written.
                do {
                    try Self.writeMetadataFile(storedData, of: target)
                } catch {
                    unlink(target.path)
                    throw error
                }
            } else {
                try Self.creatingFolders(of: target) { rename(staged.path, target.path) }
                if attached {
                    // A metadata file of the key's earlier blob would no longer describe it.
                    unlink(Self.metadataFile(target).path)
                } else {
                    try Self.writeMetadataFile(storedData, of: target)
                }
            }
        }
    }

    /// Writes `buffer` to a new file at `path` (not synced, as no blob's bytes are).
    static func write(_ buffer: ByteBuffer, to path: String) throws {
        try buffer.withUnsafeReadableBytes { try createFile(path, with: $0) }
    }

    /// Creates the file at `path` (which must not exist) holding `bytes`, all of them: again
    /// after a short write or a signal. A file left half written is removed.
    static func createFile(_ path: String, with bytes: UnsafeRawBufferPointer) throws {
        let descriptor = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(descriptor) }
        var done = 0
        while done < bytes.count {
            let wrote = Glibc.write(descriptor, bytes.baseAddress! + done, bytes.count - done)
            if wrote < 0 {
                let code = errno
                if code == EINTR { continue }
                unlink(path)
                throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
            }
            done += wrote
        }
    }

    /// Runs `call` (a link or rename to `target`); where the folder is missing, makes it and
    /// runs it again. `EEXIST` is `BlobError.exists`.
    static func creatingFolders(of target: URL, _ call: () -> Int32) throws {
        var rc = call()
        if rc != 0, errno == ENOENT {
            try FileManager.default.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
            rc = call()
        }
        guard rc == 0 else {
            let code = errno
            if code == EEXIST { throw BlobError.exists }
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
    }

    /// The extended attribute that holds a blob's metadata (JSON, as the metadata file does).
    static let metadataAttribute = "user.photoedit.blob"

    /// Attaches the metadata to the file at `path`; false where the file system keeps no user
    /// attributes (the caller then writes the metadata file).
    static func attachMetadata(_ data: Data, to path: String) throws -> Bool {
        let rc = data.withUnsafeBytes { setxattr(path, metadataAttribute, $0.baseAddress, $0.count, 0) }
        if rc == 0 { return true }
        let code = errno
        if code == ENOTSUP || code == EPERM { return false }
        throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
    }

    /// Writes the metadata file beside `target` through a temporary file renamed into place, so
    /// a reader sees all of it or none. Not synced, as the blob's bytes never were: a crash of
    /// the machine (not of the process) can lose a blob written in its last seconds, which then
    /// reads as absent (no metadata) or is served at the size its file has.
    static func writeMetadataFile(_ data: Data, of target: URL) throws {
        let file = metadataFile(target).path
        let temporary = file + ".\(UInt32.random(in: 0...UInt32.max))"
        try data.withUnsafeBytes { try createFile(temporary, with: $0) }
        guard rename(temporary, file) == 0 else {
            let failure = errno
            unlink(temporary)
            throw POSIXError(POSIXErrorCode(rawValue: failure) ?? .EIO)
        }
    }

    public func open(_ key: String, range: ClosedRange<Int>?) async throws -> BlobReader {
        let target = try path(key)
        // The file is opened first: whatever happens to the key afterwards, these bytes stay
        // readable until the reader is done (a deleted file is served whole).
        let (file, metadata) = try await Self.blocking { () -> (OpenFile, BlobMetadata) in
            let descriptor = Glibc.open(target.path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                if errno == ENOENT || errno == ENOTDIR { throw BlobError.notFound }
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
            let file = OpenFile(descriptor)
            guard let metadata = Self.readMetadata(target, descriptor: descriptor) else { throw BlobError.notFound }
            var status = stat()
            guard fstat(descriptor, &status) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            var stored = metadata
            stored.size = Int(status.st_size)
            return (file, stored)
        }
        var served: ClosedRange<Int>?
        var start = 0, end = metadata.size
        if let range {
            guard range.lowerBound < metadata.size else { throw BlobError.notFound }
            served = range.lowerBound...min(range.upperBound, metadata.size - 1)
            start = served!.lowerBound
            end = served!.upperBound + 1
        }
        let cursor = file.cursor(from: start, to: end)
        return BlobReader(metadata: metadata, range: served, length: end - start, body: BlobBody { try await cursor.next() })
    }

    public func head(_ key: String) async throws -> BlobMetadata? {
        let target = try path(key)
        return try await Self.blocking {
            guard FileManager.default.fileExists(atPath: target.path), var metadata = Self.readMetadata(target) else { return nil }
            metadata.size = Self.size(target)
            return metadata
        }
    }

    public func delete(_ key: String) async throws {
        let target = try path(key)
        try await Self.blocking {
            try? FileManager.default.removeItem(at: target)
            try? FileManager.default.removeItem(at: Self.metadataFile(target))
        }
    }

    public func list(prefix: String, modifiedBefore date: Date, limit: Int) async throws -> [String] {
        let root = root
        return try await Self.blocking {
            let base = root.appendingPathComponent(prefix)
            guard let walker = FileManager.default.enumerator(at: base, includingPropertiesForKeys: [.contentModificationDateKey, .isRegularFileKey]) else { return [] }
            var keys: [String] = []
            let rootPath = root.standardizedFileURL.path
            for case let file as URL in walker where keys.count < limit {
                guard !file.lastPathComponent.hasSuffix(".meta.json"),
                      let values = try? file.resourceValues(forKeys: [.contentModificationDateKey, .isRegularFileKey]),
                      values.isRegularFile == true, let modified = values.contentModificationDate, modified < date else { continue }
                let key = String(file.standardizedFileURL.path.dropFirst(rootPath.count + 1))
                if BlobKey.isValid(key) { keys.append(key) }
            }
            return keys
        }
    }

    public func presignedGET(_ key: String, expiresIn: Int, now: Date) -> String {
        publicBaseURL + signer.downloadPath(for: key, lifetime: expiresIn, now: now)
    }

    public func presignedPUT(_ key: String, contentType: String, owner: String, expiresIn: Int, now: Date) -> PresignedRequest {
        let expires = Int(now.timeIntervalSince1970) + expiresIn
        let encodedOwner = owner.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        if key.hasPrefix("uploads/") {
            // The app's upload: the gateway's own PUT checks type, size and pixels, and writes once.
            let sig = signer.signature(method: "PUT", key: key, owner: owner, contentType: contentType, expires: expires)
            return PresignedRequest(url: "\(publicBaseURL)/api/v1/uploads/\(key)?owner=\(encodedOwner)&exp=\(expires)&sig=\(sig)",
                                    headers: ["Content-Type": contentType])
        }
        let sig = signer.signature(method: URLSigner.writeMethod, key: key, owner: owner, contentType: contentType, expires: expires)
        return PresignedRequest(url: "\(publicBaseURL)/files/\(key)?owner=\(encodedOwner)&exp=\(expires)&sig=\(sig)",
                                headers: ["Content-Type": contentType])
    }

    // MARK: Files

    static func metadataFile(_ target: URL) -> URL { target.appendingPathExtension("meta.json") }

    static let metadataEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }()

    static func metadataData(_ metadata: BlobMetadata) throws -> Data {
        try metadataEncoder.encode(metadata)
    }

    static let metadataDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()

    /// A blob's metadata: its file's attribute (read through `descriptor` when the file is open,
    /// so that it describes those bytes), or else its metadata file; nil if it has neither.
    static func readMetadata(_ target: URL, descriptor: Int32? = nil) -> BlobMetadata? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { bytes in
            if let descriptor { return fgetxattr(descriptor, metadataAttribute, bytes.baseAddress, bytes.count) }
            return getxattr(target.path, metadataAttribute, bytes.baseAddress, bytes.count)
        }
        if count > 0 { return try? metadataDecoder.decode(BlobMetadata.self, from: Data(buffer[0..<count])) }
        guard let data = try? Data(contentsOf: metadataFile(target)) else { return nil }
        return try? metadataDecoder.decode(BlobMetadata.self, from: data)
    }

    static func size(_ file: URL) -> Int {
        var status = stat()
        return stat(file.path, &status) == 0 ? Int(status.st_size) : 0
    }

    /// Runs file work on NIO's blocking pool, off the cooperative one.
    static func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await NIOThreadPool.singleton.runIfActive(work)
    }
}

/// A file descriptor, closed when the last reader lets it go.
final class OpenFile: Sendable {
    let descriptor: Int32
    init(_ descriptor: Int32) { self.descriptor = descriptor }
    deinit { close(descriptor) }

    /// Reads `start..<end` in chunks of 64 KiB, each on the blocking pool.
    func cursor(from start: Int, to end: Int) -> Cursor { Cursor(file: self, start: start, end: end) }

    final class Cursor: @unchecked Sendable {
        // @unchecked: `offset` is advanced by the one task that iterates the body.
        let file: OpenFile
        var offset: Int
        let end: Int
        init(file: OpenFile, start: Int, end: Int) {
            self.file = file
            self.offset = start
            self.end = end
        }

        func next() async throws -> ByteBuffer? {
            guard offset < end else { return nil }
            let (file, offset, count) = (file, offset, min(64 << 10, end - offset))
            let chunk = try await FolderBlobStore.blocking { () -> ByteBuffer in
                var buffer = ByteBufferAllocator().buffer(capacity: count)
                var failure: Int32 = 0
                let read = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { pointer in
                    let read = pread(file.descriptor, pointer.baseAddress, count, off_t(offset))
                    // The closure must answer how many bytes it wrote: never a negative count.
                    if read < 0 { failure = errno }
                    return max(0, read)
                }
                if failure != 0 { throw POSIXError(POSIXErrorCode(rawValue: failure) ?? .EIO) }
                guard read > 0 else { throw BlobStoreError(.unavailable, "a file ended before its size") }
                return buffer
            }
            self.offset += chunk.readableBytes
            return chunk
        }
    }
}
