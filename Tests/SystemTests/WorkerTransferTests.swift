import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

/// Workers that read and write only through the presigned URLs of their assignments.
@Suite("Worker transfers", .serialized, .timeLimit(.minutes(5)))
struct WorkerTransferTests {
    @Test func aWorkerWhoseURLsExpiredWhileItsJobWaitedAsksForFreshOnes() async throws {
        // Given URLs that live 3 s, and a worker that runs one job while it holds the next
        let system = try await JobSystem(workers: 1, jobs: ["JOBS_TRANSFER_TTL_S": "3"])
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // When a 3-second job runs first, and a second waits behind it, prefetched
            let slow = try #require(JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "slow-remote"))["jobId"] as? String)
            let waiting = try #require(JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy"))["jobId"] as? String)
            // Then both complete in their first attempt: the URLs that expired meanwhile (the
            // slow job's outputs, the waiting job's input) were renewed rather than refused
            for jobId in [slow, waiting] {
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
                #expect(status["status"] as? String == "completed", "\(status)")
                let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: JobSystem.userId(ofGuest: user)))
                #expect(job.attempts == 1, "\(jobId) took \(job.attempts) attempts: \(job.lastError ?? "")")
            }
        }
        await system.stop()
    }

    /// A worker on a second host (its own network and mount namespaces): it reaches jobs and the
    /// store only over the veth pair, and the data folder is an empty folder to it.
    func completesJobsFromAnotherHost(_ store: JobSystem.Store) async throws {
        let host = try TestHost()
        let system = try await JobSystem(workers: 0, blobs: store, hostAddress: host.hostAddress)
        // The other host sees no file of the system's data folder
        let (status, listing) = host.run("ls -A \"\(system.services.dataDirectory.path)\" | wc -l", hiding: system.services.dataDirectory)
        #expect(status == 0 && listing.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "\(listing)")
        let worker = try system.startWorker(extra: ["WORKER_ID": "far"], on: host)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            var jobs: [String] = []
            for effect in ["grayscale", "copy"] {
                jobs.append(try #require(JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: effect))["jobId"] as? String))
            }
            for jobId in jobs {
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
                #expect(status["status"] as? String == "completed", "\(status) (worker: \(worker.output.suffix(600)))")
            }
        }
        #expect(worker.output.contains("far"))
        await system.stop()
    }

    @Test(.enabled(if: TestHost.available, "needs root, ip and unshare"))
    func aWorkerOnAnotherHostCompletesJobsWithTheFolderStore() async throws {
        try await completesJobsFromAnotherHost(.folder)
    }

    @Test(.enabled(if: TestHost.available, "needs root, ip and unshare"))
    func aWorkerOnAnotherHostCompletesJobsWithTheS3Store() async throws {
        try await completesJobsFromAnotherHost(.s3)
    }
}
