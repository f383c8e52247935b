import Blobs
import CXattr
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import Testing

/// The folder store, the embedded default: the same contract as the S3 store's, and downloads
/// that a deletion never cuts short.
@Suite("Folder blob store", .timeLimit(.minutes(5)))
struct FolderBlobStoreTests {
    static func store() async throws -> (FolderBlobStore, URL) {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("blobs-\(UUID().uuidString)")
        return (try await FolderBlobStore.open(root: root, signer: URLSigner(secret: "s"), publicBaseURL: "http://gateway"), root)
    }

    static func bytes(_ count: Int) -> ByteBuffer { ByteBuffer(bytes: (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7) }) }

    @Test func putGetRangeHeadDeleteAndOnlyOnce() async throws {
        let (store, root) = try await Self.store()
        defer { try? FileManager.default.removeItem(at: root) }
        let data = Self.bytes(200_000)
        try await store.put("results/j/1.jpg", from: .bytes(data), metadata: BlobMetadata(owner: "u", contentType: "image/jpeg"), ifAbsent: true)
        #expect(try await store.head("results/j/1.jpg")?.size == 200_000)
        #expect(try await store.bytes(of: "results/j/1.jpg") == data)
        #expect(try await store.bytes(of: "results/j/1.jpg", range: 100...109) == data.getSlice(at: 100, length: 10))
        await #expect(throws: BlobError.exists) {
            try await store.put("results/j/1.jpg", from: .bytes(Self.bytes(5)), metadata: BlobMetadata(owner: "u", contentType: "image/jpeg"), ifAbsent: true)
        }
        #expect(try await store.list(prefix: "results/", modifiedBefore: Date().addingTimeInterval(60), limit: 10) == ["results/j/1.jpg"])
        try await store.delete("results/j/1.jpg")
        #expect(try await store.head("results/j/1.jpg") == nil)
        await #expect(throws: BlobError.notFound) { try await store.open("results/j/1.jpg") }
        await #expect(throws: BlobError.invalidKey) { try await store.open("../etc/passwd") }
    }

    @Test func aBlobsMetadataTravelsOnItsFileAndOldMetadataFilesStillRead() async throws {
        let (store, root) = try await Self.store()
        defer { try? FileManager.default.removeItem(at: root) }
        let data = Self.bytes(1_000)
        let written = BlobMetadata(owner: "u", contentType: "image/jpeg", createdAt: Date(timeIntervalSince1970: 1_800_000_000))
        try await store.put("results/j/1.jpg", from: .bytes(data), metadata: written, ifAbsent: true)
        // One file: the metadata is the file's attribute, not a second file beside it.
        let file = root.appendingPathComponent("results/j/1.jpg")
        #expect(!FileManager.default.fileExists(atPath: file.path + ".meta.json"))
        #expect(getxattr(file.path, "user.photoedit.blob", nil, 0) > 0)
        var expected = written
        expected.size = 1_000
        #expect(try await store.head("results/j/1.jpg") == expected)
        #expect(try await store.open("results/j/1.jpg").metadata == expected)
        // Replaced (not ifAbsent): the new metadata, and a metadata file of the old blob is gone.
        try Data("{}".utf8).write(to: URL(fileURLWithPath: file.path + ".meta.json"))
        try await store.put("results/j/1.jpg", from: .bytes(Self.bytes(10)), metadata: BlobMetadata(owner: "v", contentType: "image/png"), ifAbsent: false)
        #expect(try await store.head("results/j/1.jpg")?.owner == "v")
        #expect(!FileManager.default.fileExists(atPath: file.path + ".meta.json"))
        // A blob written before attributes were used: its file and a .meta.json beside it.
        let old = root.appendingPathComponent("results/k/1.jpg")
        try FileManager.default.createDirectory(at: old.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(repeating: 7, count: 300).write(to: old)
        try Data(#"{"owner":"w","contentType":"image/jpeg","size":300,"createdAt":"2026-01-01T00:00:00Z"}"#.utf8)
            .write(to: URL(fileURLWithPath: old.path + ".meta.json"))
        #expect(try await store.head("results/k/1.jpg")?.owner == "w")
        #expect(try await store.bytes(of: "results/k/1.jpg") == ByteBuffer(bytes: [UInt8](repeating: 7, count: 300)))
        #expect(try await store.list(prefix: "results/", modifiedBefore: Date().addingTimeInterval(60), limit: 10).sorted() == ["results/j/1.jpg", "results/k/1.jpg"])
        try await store.delete("results/k/1.jpg")
        #expect(try await store.head("results/k/1.jpg") == nil)
        #expect(!FileManager.default.fileExists(atPath: old.path + ".meta.json"))
    }

    @Test func aBlobDeletedWhileItIsReadIsReadWhole() async throws {
        let (store, root) = try await Self.store()
        defer { try? FileManager.default.removeItem(at: root) }
        let data = Self.bytes(1 << 20)
        try await store.put("thumbnails/j/1.jpg", from: .bytes(data), metadata: BlobMetadata(owner: "u", contentType: "image/jpeg"))
        // Given a reader opened, when the blob is deleted before a byte is read
        let reader = try await store.open("thumbnails/j/1.jpg")
        try await store.delete("thumbnails/j/1.jpg")
        // Then the reader still yields every byte it announced
        var got = ByteBuffer()
        for try await var chunk in reader.body { got.writeBuffer(&chunk) }
        #expect(reader.length == data.readableBytes && got == data)
        await #expect(throws: BlobError.notFound) { try await store.open("thumbnails/j/1.jpg") }
    }

    @Test func aThumbnailFetchedWhileItsItemIsDeletedIsWholeOr404() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let port = try #require(client.port)
            var outcomes: [String: Int] = [:]
            for _ in 0..<8 {
                // A new original each round: deleting an item deletes an original no other job uses.
                let key = try await JobSystem.upload(client, as: user)
                let jobId = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "copy")
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
                let url = try #require(status["resultUrl"] as? String)
                // The download and the delete race each other
                let connection = try RawConnection(port: port)
                connection.send("GET \(JobSystem.path(url)) HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
                async let deleted = client.execute(uri: "/api/v1/history/\(jobId)", method: .delete, headers: user)
                let answer = await connection.readAll()
                #expect(try await deleted.status == .ok)
                let (head, body) = RawConnection.split(answer)
                if head.hasPrefix("HTTP/1.1 200") {
                    let length = try #require(RawConnection.contentLength(head))
                    #expect(body.count == length, "a download was cut short: \(body.count) of \(length) bytes")
                    outcomes["whole", default: 0] += 1
                } else {
                    #expect(head.hasPrefix("HTTP/1.1 404"), "answered \(head.prefix(40))")
                    outcomes["404", default: 0] += 1
                }
            }
            #expect(outcomes.values.reduce(0, +) == 8)
        }
        await system.stop()
    }
}
