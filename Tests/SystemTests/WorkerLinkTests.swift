import Foundation
import Messages
import Testing

/// A worker cut off from jobs mid-generation (a partition, a blip longer than three heartbeats)
/// keeps its request at the provider, and holds the job again when it comes back within
/// `JOBS_LOST_WORKER_GRACE_S`: the model is called once, as a real provider bills each call.
@Suite("A worker's link cut mid-generation", .serialized, .timeLimit(.minutes(5)))
struct WorkerLinkTests {
    @Test func aWorkerBackWithinTheGraceFinishesItsModelCallWhichRanOnce() async throws {
        // Given a worker that reaches jobs through a link the test can cut, running a model call
        // of 10 s
        let system = try await JobSystem(workers: 0)
        let link = try #require(FreezableProxy(upstream: system.workerPort))
        defer { link.stop() }
        _ = try system.startWorker(extra: ["JOBS_WORKER_ENDPOINT": "tcp://127.0.0.1:\(link.port)"])
        let jobs = try #require(system.services.processes[.jobs])
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let jobId = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: user, imageKey: key, effect: "ten-second-remote"))
            try await waitUntil(within: .seconds(30)) { system.providerLoad.now == 1 }
            // When the link is cut until jobs declares the worker lost, then comes back
            link.freeze()
            try await waitUntil(within: .seconds(30)) { jobs.output.contains("worker lost") }
            link.thaw()
            // Then the job completes under its first attempt, and the provider was called once
            let finished = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(60))
            #expect(finished["status"] as? String == "completed", "\(finished)")
            let record = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: JobSystem.userId(ofGuest: user)))
            #expect(record.attempts == 1)
            #expect(system.providerLoad.total == 1)
        }
        await system.stop()
    }
}
