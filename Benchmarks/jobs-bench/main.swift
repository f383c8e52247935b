import Blobs
import Bus
import Foundation
import Messages
import ServiceKit

// Jobs benchmark client: `jobs-bench JOBS_ENDPOINT BLOB_DIR COUNT EFFECT` puts one input image in
// the blob folder, creates COUNT jobs with EFFECT through the jobs service over the bus (64 in
// flight), waits until every one has completed, and prints `jobs_per_s=X completed=N failed=F`,
// timed from the first creation to the last completion.

func run(endpoint: String, blobDirectory: String, count: Int, effect: String, image: String) async throws {
    ProcessLogging.bootstrap(level: .warning)
    let blobs = try await FolderBlobStore.open(root: URL(fileURLWithPath: blobDirectory), signer: URLSigner(secret: "unused"), publicBaseURL: "")
    let key = "uploads/bench/\(UUID().uuidString.lowercased()).jpg"
    try await blobs.put(key, from: .file(URL(fileURLWithPath: image)), metadata: BlobMetadata(owner: "bench", contentType: "image/jpeg"))
    try await withBusClient(.init(endpoint: endpoint, defaultTimeout: .seconds(30))) { client in
        let user = "bench-\(UUID().uuidString.prefix(8))"
        // Job ids as the gateway mints them (time-ordered).
        let ids = (0..<count).map { _ in TimeOrderedID.make() }

        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            var next = 0
            func add() {
                let id = ids[next]
                next += 1
                group.addTask {
                    _ = try await client.call(Jobs.create, CreateJob(jobId: id, userId: user, isPro: false, imageKey: key, effectId: effect))
                }
            }
            for _ in 0..<min(64, count) { add() }
            while try await group.next() != nil {
                if next < count { add() }
            }
        }
        // Follow the unfinished jobs with `jobs.watch`, as the gateway's event streams do, each with
        // the version seen, answered with those that changed: the oldest 64 unfinished (one user's
        // jobs are handed out in order, so they end about in order), every 10 ms while none ends.
        var failed = 0
        var seen = Dictionary(uniqueKeysWithValues: ids.map { ($0, 1) })
        var unfinished = ids[...]
        while !unfinished.isEmpty {
            let batch = unfinished.prefix(64).map { WatchJobs.Seen(jobId: $0, userId: user, version: seen[$0] ?? 1, progress: 0) }
            let watched = try await client.call(Jobs.watch, WatchJobs(jobs: batch))
            var ended: Set<String> = Set(watched.gone)
            for job in watched.changed {
                seen[job.id] = job.version
                if job.status.isTerminal {
                    if job.status != .completed { failed += 1 }
                    ended.insert(job.id)
                }
            }
            failed += watched.gone.count
            if ended.isEmpty {
                try await Task.sleep(for: .milliseconds(10))
            } else {
                unfinished = unfinished.filter { !ended.contains($0) }[...]
            }
        }
        let elapsed = start.duration(to: .now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        print(String(format: "jobs_per_s=%.1f completed=%d failed=%d seconds=%.2f", Double(count - failed) / seconds, count - failed, failed, seconds))
    }
}

let arguments = CommandLine.arguments
guard arguments.count >= 6, let count = Int(arguments[3]) else {
    print("usage: jobs-bench JOBS_ENDPOINT BLOB_DIR COUNT EFFECT IMAGE")
    exit(2)
}
try await run(endpoint: arguments[1], blobDirectory: arguments[2], count: count, effect: arguments[4], image: arguments[5])
