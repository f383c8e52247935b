import Blobs
import Foundation
import Logging
import Metrics
import ServiceKit
import ServiceLifecycle

/// Removes uploads that no job ever used, once they are older than `age` (a day): an app that
/// asked for an upload URL and never started an edit leaves nothing behind for good. Uploads a
/// job uses go with the job's last deletion (`JobsStore.purge`).
///
/// Why a sweep rather than a bucket lifecycle rule: a rule selects objects by prefix, tag and age,
/// not by whether a job points at them; tagging every upload at presign and untagging it at job
/// creation would add a store call to every creation and work only on stores that filter
/// lifecycle rules by tag. The sweep lists `uploads/` and asks the jobs database, on every store.
public struct UnusedUploadSweeper: Service {
    let blobs: any BlobStore
    let store: any JobsStore
    let age: TimeInterval
    let interval: Duration
    let logger: Logger

    public init(blobs: any BlobStore, store: any JobsStore, age: TimeInterval = 86_400, interval: Duration = .seconds(3600), logger: Logger) {
        self.blobs = blobs
        self.store = store
        self.age = age
        self.interval = interval
        self.logger = logger
    }

    public func run() async throws {
        await Periodic.run(every: interval, logger: logger, failure: "unused upload sweep failed") { _ = try await sweep() }
    }

    /// Deletes the uploads older than `age` at `now` that no job uses, up to 10,000 a round;
    /// returns how many.
    @discardableResult
    public func sweep(now: Date = Date()) async throws -> Int {
        let old = try await blobs.list(prefix: "uploads/", modifiedBefore: now.addingTimeInterval(-age), limit: 10_000)
        var deleted = 0
        for start in stride(from: 0, to: old.count, by: 500) {
            for key in try await store.unused(Array(old[start..<min(old.count, start + 500)])) {
                try await blobs.delete(key)
                deleted += 1
            }
        }
        if deleted > 0 {
            Counter(label: "jobs_unused_uploads_deleted_total").increment(by: deleted)
            logger.info("unused uploads removed", metadata: ["count": "\(deleted)"])
        }
        return deleted
    }
}
