import Blobs
import Foundation
import Synchronization
import Testing

@Suite("Blob metadata cache")
struct BlobMetadataCacheTests {
    @Test func metadataIsReadOnceWithinItsLifetimeAndAgainAfter() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("blobs-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let store = try DiskBlobStore(root: folder)
        let source = try store.temporaryFile()
        try Data([1, 2, 3]).write(to: source)
        try await store.adopt(file: source, as: "uploads/u/a.jpg", metadata: BlobMetadata(owner: "u", contentType: "image/jpeg", size: 3))
        let clock = Mutex(ContinuousClock.now)
        let cache = BlobMetadataCache(store: store, lifetime: .seconds(60), now: { clock.withLock { $0 } })

        // Read once, the file is gone, still known within the lifetime: no file read
        #expect(try await cache.metadata(of: "uploads/u/a.jpg")?.owner == "u")
        try await store.delete("uploads/u/a.jpg")
        #expect(try await cache.metadata(of: "uploads/u/a.jpg")?.owner == "u")
        // Past the lifetime it is read again, and found absent; absence is not remembered
        clock.withLock { $0 = $0.advanced(by: .seconds(61)) }
        #expect(try await cache.metadata(of: "uploads/u/a.jpg") == nil)
        let again = try store.temporaryFile()
        try Data([1]).write(to: again)
        try await store.adopt(file: again, as: "uploads/u/a.jpg", metadata: BlobMetadata(owner: "v", contentType: "image/png", size: 1))
        #expect(try await cache.metadata(of: "uploads/u/a.jpg")?.owner == "v")
    }
}
