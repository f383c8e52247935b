import Blobs
import Foundation
import JobsCore
import JobsService
import Logging
import Messages
import NIOCore
import Testing

@Suite("Unused upload sweep", .timeLimit(.minutes(5)))
struct UnusedUploadSweeperTests {
    @Test func uploadsNoJobUsedGoOnceADayOldAndUsedOnesStay() async throws {
        // Given a folder store with three uploads and other blobs, and a job on one upload
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("sweep-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let blobs = try await FolderBlobStore.open(root: root, signer: URLSigner(secret: "s"), publicBaseURL: "http://g")
        for key in ["uploads/a/used.jpg", "uploads/a/unused.jpg", "uploads/b/unused.png", "results/j/1.jpg"] {
            try await blobs.put(key, from: .bytes(ByteBuffer(bytes: [1, 2, 3])), metadata: BlobMetadata(owner: "a", contentType: "image/jpeg"))
        }
        let store = SQLiteJobsStore(database: try JobsDatabase.inMemory(), retry: RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10)), effectTitles: [:])
        _ = try await store.create(CreateJob(jobId: "j", userId: "a", isPro: false, imageKey: "uploads/a/used.jpg", effectId: "copy"),
                                   effectId: "copy", parameters: [:], now: Date())
        let sweeper = UnusedUploadSweeper(blobs: blobs, store: store, age: 86_400, logger: Logger(label: "test"))

        // When it sweeps now, nothing is a day old: nothing goes
        #expect(try await sweeper.sweep(now: Date()) == 0)
        // When it sweeps a day and a minute later: the unused uploads go, the used one and the
        // other blobs stay
        #expect(try await sweeper.sweep(now: Date().addingTimeInterval(86_460)) == 2)
        for gone in ["uploads/a/unused.jpg", "uploads/b/unused.png"] { #expect(try await blobs.head(gone) == nil) }
        for kept in ["uploads/a/used.jpg", "results/j/1.jpg"] { #expect(try await blobs.head(kept) != nil) }
    }
}
