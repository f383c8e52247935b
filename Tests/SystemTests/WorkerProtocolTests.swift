import Bus
import Foundation
import GRDB
import HTTPTypes
import Messages
import Synchronization
import Testing

@Suite("Worker protocol against the real jobs service", .serialized, .timeLimit(.minutes(5)))
struct WorkerProtocolTests {
    /// What a hand-driven worker has received, collected as it arrives.
    actor Inbox {
        private var messages: [DispatcherMessage] = []
        private var collector: Task<Void, Never>?

        init(_ channel: BusChannel) {
            Task { await self.start(channel) }
        }

        private func start(_ channel: BusChannel) {
            collector = Task {
                for await message in channel.incoming {
                    if let decoded = BusChannel.decode(DispatcherMessage.self, message) { self.append(decoded) }
                }
            }
        }

        private func append(_ message: DispatcherMessage) { messages.append(message) }

        /// Removes and returns the first message `match` picks.
        func take<T: Sendable>(_ match: (DispatcherMessage) -> T?) -> T? {
            for (index, message) in messages.enumerated() {
                if let found = match(message) {
                    messages.remove(at: index)
                    return found
                }
            }
            return nil
        }
    }

    /// Waits for a message `match` picks (at most `limit`).
    func next<T: Sendable>(_ inbox: Inbox, within limit: Duration = .seconds(10), _ match: @Sendable (DispatcherMessage) -> T?) async -> T? {
        let deadline = ContinuousClock.now.advanced(by: limit)
        while ContinuousClock.now < deadline {
            if let found = await inbox.take(match) { return found }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    /// A hand-driven worker's heartbeats, naming `held`, every 300 ms until cancelled.
    func heartbeats(from channel: BusChannel, naming held: [JobAttempt]) -> Task<Void, Never> {
        Task {
            while !Task.isCancelled {
                channel.send(WorkerMessage.heartbeat(running: held))
                try? await Task.sleep(for: .milliseconds(300))
            }
        }
    }

    @Test func aWorkerWithASlowHeartbeatKeepsItsTenSecondJob() async throws {
        // Given a real worker that sends heartbeats every 5 s (the service's own are every 1 s)
        let system = try await JobSystem(workers: 0)
        try system.startWorker(extra: ["WORKER_HEARTBEAT_MS": "5000"])
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // When it runs a job that takes 10 s
            let created = JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "ten-second-remote"))
            let jobId = try #require(created["jobId"] as? String)
            let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(40))
            // Then it completes on its first attempt: the worker was never declared dead
            #expect(status["status"] as? String == "completed")
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: JobSystem.userId(ofGuest: user)))
            #expect(job.attempts == 1)
        }
        await system.stop()
    }

    /// Uploads an image as a new guest and creates `count` jobs of the 3 s remote effect through
    /// the gateway: the guest's user id and the job ids, oldest first.
    func slowJobs(_ count: Int, effect: String = "slow-remote", in system: JobSystem) async throws -> (user: String, jobs: [String]) {
        let guest = JobSystem.guest(UUID())
        let ids = Mutex<[String]>([])
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: guest)
            for _ in 0..<count {
                let created = JobSystem.json(try await JobSystem.createJob(client, as: guest, imageKey: key, effect: effect))
                let id = try #require(created["jobId"] as? String)
                ids.withLock { $0.append(id) }
            }
        }
        return (JobSystem.userId(ofGuest: guest), ids.withLock { $0 })
    }

    func job(_ id: String, of user: String, in system: JobSystem) async throws -> JobRecord {
        try await system.clients.jobs.call(Jobs.get, JobReference(jobId: id, userId: user))
    }

    /// Creates `count` jobs of `effect` for a new device user straight through the jobs service
    /// (no image behind them: the effects used read none, or the worker is driven by hand).
    func queuedJobs(_ count: Int, effect: String, in system: JobSystem) async throws -> (user: String, jobs: [String]) {
        let user = "device:\(UUID().uuidString.lowercased())"
        let ids = (0..<count).map { _ in UUID().uuidString.lowercased() }
        for id in ids {
            _ = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: id, userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: effect))
        }
        return (user, ids)
    }

    /// Takes messages, those in `all` each on its own, until `count` attempts that `pick` finds
    /// have come (or one wait times out); the attempts, and the most that came in one message.
    func collectAttempts(_ inbox: Inbox, count: Int, _ pick: @escaping @Sendable (DispatcherMessage) -> JobAttempt?) async -> (attempts: [JobAttempt], largest: Int) {
        var attempts: [JobAttempt] = []
        var largest = 0
        while attempts.count < count {
            guard let batch = await next(inbox, { message -> [JobAttempt]? in
                if case .all(let messages) = message {
                    let found = messages.compactMap(pick)
                    return found.isEmpty ? nil : found
                }
                return pick(message).map { [$0] }
            }) else { break }
            largest = max(largest, batch.count)
            attempts += batch
        }
        return (attempts, largest)
    }

    @Test func aWorkerPrefetchesOneJobRunsOneAtATimeAndDropsAPrefetchedJobThatIsCancelled() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, jobs) = try await slowJobs(3, in: system)
        func status(_ id: String) async throws -> JobStatus { try await job(id, of: user, in: system).status }
        // Given a real worker that runs one job at once and prefetches one (the defaults)
        try system.startWorker(capacity: 1)
        // Then it holds two jobs (the second prefetched) while the third stays queued
        try await waitUntil {
            let (first, second) = (try await status(jobs[0]), try await status(jobs[1]))
            return first == .processing && second == .processing
        }
        #expect(try await status(jobs[2]) == .queued)
        // When the prefetched one is cancelled, it ends before it ever ran
        _ = try await system.clients.jobs.call(Jobs.cancel, JobReference(jobId: jobs[1], userId: user))
        try await waitUntil { try await status(jobs[1]) == .cancelled }
        #expect(try await status(jobs[0]) == .processing)
        // And the others run to completion, one at a time at the provider
        try await waitUntil(within: .seconds(20)) {
            let (first, third) = (try await status(jobs[0]), try await status(jobs[2]))
            return first == .completed && third == .completed
        }
        #expect(system.providerLoad.most == 1)
        await system.stop()
    }

    @Test func aPrefetchedJobFetchesItsInputWhileTheJobBeforeItHoldsThePlace() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, jobs) = try await slowJobs(2, effect: "held-remote", in: system)
        func job(_ id: String) async throws -> JobRecord { try await self.job(id, of: user, in: system) }
        // Given a worker of one place that prefetches one, with the first job at the endpoint,
        // held there until the test lets it go (a condition, not a time: with 3 s at the endpoint
        // and 2 s for the fetch, a busy machine could have failed it)
        try system.startWorker(capacity: 1)
        try await waitUntil { system.providerLoad.now == 1 }
        // Then the second job, prefetched, has its input fetched and checked (its progress 0.1,
        // reported once that is done) while the first still holds the place
        try await waitUntil { try await job(jobs[1]).progress >= 0.1 }
        #expect(try await job(jobs[0]).status == .processing)
        #expect(system.providerLoad.now == 1)
        // And it reaches the endpoint only after the first, which was assigned before it
        system.providerLoad.release()
        try await waitUntil(within: .seconds(20)) {
            let (first, second) = (try await job(jobs[0]), try await job(jobs[1]))
            return first.status == .completed && second.status == .completed
        }
        #expect(system.providerLoad.most == 1)
        await system.stop()
    }

    @Test func aWorkerStoppedWithSIGTERMFinishesItsJobAndGivesBackTheOneItPrefetched() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, jobs) = try await slowJobs(2, in: system)
        func job(_ id: String) async throws -> JobRecord { try await self.job(id, of: user, in: system) }
        // Given a worker running the first job (it is at the provider) with the second prefetched
        let worker = try system.startWorker(capacity: 1)
        try await waitUntil {
            let (first, second) = (try await job(jobs[0]), try await job(jobs[1]))
            return first.status == .processing && second.status == .processing && system.providerLoad.now == 1
        }
        // When it is told to stop
        worker.signal(SIGTERM)
        // Then the prefetched job is given back (queued again, saying why, not declared lost)
        try await waitUntil { try await job(jobs[1]).status == .queued }
        #expect(try await job(jobs[1]).lastError?.contains("stopped before running it") == true)
        // And the running one finishes on its first attempt before the worker exits cleanly
        #expect(try await worker.waitForExit(within: .seconds(60)) == 0)
        let first = try await job(jobs[0])
        #expect(first.status == .completed && first.attempts == 1, "the worker said: \(worker.output.suffix(4000))")
        #expect(!system.services.processes[.jobs]!.output.contains("worker lost"))
        await system.stop()
    }

    @Test func aWorkerStoppedAfterItsJobsServiceWentAwayStopsAndHandsItsJobBack() async throws {
        let system = try await JobSystem(workers: 0)
        _ = try await slowJobs(1, effect: "ten-second-remote", in: system)
        // Given a worker running a job (ten seconds at the provider)
        let worker = try system.startWorker(capacity: 1, extra: ["WORKER_HEARTBEAT_MS": "200"])
        try await waitUntil { system.providerLoad.now == 1 }
        // When the jobs service goes away (as when Ctrl-C stops the whole stack) and the worker
        // is told to stop
        system.services.processes[.jobs]!.signal(SIGKILL)
        worker.signal(SIGTERM)
        // Then it does not wait for its job (nor for a service that is gone): it stops once the
        // service has been silent for three heartbeats, handing the job back, and exits cleanly
        #expect(try await worker.waitForExit(within: .seconds(60)) == 0)
        #expect(worker.output.contains("stopping without the jobs service; jobs handed back"), "the worker said: \(worker.output.suffix(4000))")
        await system.stop()
    }

    @Test func aWorkerStoppedAsItConnectsGivesBackTheJobsSentMeanwhileAndWaitsForNoneToBeDeclaredLost() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, jobs) = try await slowJobs(2, in: system)
        func job(_ id: String) async throws -> JobRecord { try await self.job(id, of: user, in: system) }
        // Given a worker that says `ready` and then, told to stop, `leaving`, while the jobs
        // service is paused: the service hears both at once, and its assignments cross the
        // worker's leaving (the race a fresh-clone CI run once met by chance)
        // (Heartbeats of 5 s: a worker waits three of them for the service's answer once it is
        // stopping, time enough for a service resumed on a busy machine to catch up; at the 1 s
        // default it once gave up before a loaded run's service had answered.)
        let jobsService = system.services.processes[.jobs]!
        jobsService.signal(SIGSTOP)
        let worker = try system.startWorker(capacity: 1, extra: ["WORKER_HEARTBEAT_MS": "5000"])
        // (Sent, not answered: the worker logs "connected" once the service answers.)
        try await waitUntil { worker.output.contains("ready sent") }
        worker.signal(SIGTERM)
        try await waitUntil { worker.output.contains("stopping") }
        jobsService.signal(SIGCONT)
        // Then the worker waits for the service's answer, gives back what came, and exits cleanly
        #expect(try await worker.waitForExit(within: .seconds(60)) == 0)
        // And both jobs are queued again, saying why; neither waited for the worker to be declared
        // lost (three heartbeats of silence), which would have said "worker lost" (no time bound:
        // what the jobs say, and what the service logged, tell the two apart)
        try await waitUntil {
            for id in jobs where try await job(id).status != .queued { return false }
            return true
        }
        for id in jobs {
            let record = try await job(id)
            #expect(record.attempts == 1 && record.lastError?.contains("stopped before running it") == true, "\(record)")
        }
        #expect(!jobsService.output.contains("worker lost"), "\(jobsService.output.suffix(3000))")
        #expect(!worker.output.contains("without the jobs service's answer"))
        await system.stop()
    }

    @Test func aRemoteEffectsSlotGoesToTheNextJobOnceItsEndpointAnswered() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, jobs) = try await slowJobs(2, effect: "held-remote", in: system)
        func status(_ id: String) async throws -> JobStatus { try await job(id, of: user, in: system).status }
        // Given a worker of capacity 1 that prefetches nothing, its first job at the endpoint
        // (held there), and the gateway its result is written through paused
        try system.startWorker(capacity: 1, extra: ["WORKER_PREFETCH": "0"])
        try await waitUntil { system.providerLoad.now == 1 }
        let store = try #require(system.replica)
        store.signal(SIGSTOP)
        // Then once the endpoint answered, the second job has the slot while the first still writes
        // (it cannot finish while the gateway is paused: the second would wait for ever)
        system.providerLoad.release()
        try await waitUntil {
            let (first, second) = (try await status(jobs[0]), try await status(jobs[1]))
            return first == .processing && second == .processing
        }
        // And both complete, one at a time at the endpoint
        store.signal(SIGCONT)
        try await waitUntil(within: .seconds(20)) {
            let (first, second) = (try await status(jobs[0]), try await status(jobs[1]))
            return first == .completed && second == .completed
        }
        #expect(system.providerLoad.most == 1)
        await system.stop()
    }

    @Test func jobsThatEndAtOnceLeaveTheWorkerHoldingNothing() async throws {
        // Given a worker of capacity 8 and 40 jobs of an effect that ends at once
        let system = try await JobSystem(workers: 0)
        let worker = try system.startWorker(capacity: 8)
        let (user, ids) = try await queuedJobs(40, effect: "noop", in: system)
        try await waitUntil(within: .seconds(30)) {
            var done = 0
            for id in ids where try await system.clients.jobs.call(Jobs.get, JobReference(jobId: id, userId: user)).status == .completed { done += 1 }
            return done == ids.count
        }
        // When it is asked to stop, then it stops: it holds no job (one whose task ended before
        // it was noted as running used to stay held for ever, and the worker never exited)
        worker.signal(SIGTERM)
        let status = try await worker.waitForExit(within: .seconds(10))
        #expect(status != nil, "the worker did not exit")
        await system.stop()
    }

    @Test func aWorkerThatTakesBatchesGetsItsAssignmentsAndAcknowledgementsInOneMessageAndSendsItsResultsInOne() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, ids) = try await queuedJobs(20, effect: "noop", in: system)
        let worker = BusChannel.connecting(system.workerEndpoint)
        try await worker.running {
            let inbox = Inbox(worker)
            // Given a hand-driven worker that announces batches, with room for all 20 jobs
            worker.send(WorkerMessage.ready(WorkerReady(workerId: "batching", capacity: 20, effects: ["*"], batches: true)))
            // Then the service says it takes batches, and the 20 jobs, started in one
            // transaction, come in messages of several assignments
            let welcomed = await next(inbox) { message -> Bool? in
                if case .batches = message { return true }
                if case .all(let messages) = message, messages.contains(.batches) { return true }
                return nil
            }
            #expect(welcomed == true)
            let (attempts, largestAssigned) = await collectAttempts(inbox, count: ids.count) { if case .assign(let job) = $0 { job.attempt } else { nil } }
            #expect(attempts.count == ids.count)
            #expect(largestAssigned > 1, "every assignment came alone")
            let beating = heartbeats(from: worker, naming: attempts)
            defer { beating.cancel() }
            // When it sends every result in one message
            worker.send(WorkerMessage.all(attempts.map { .done($0, JobOutput(resultKey: "results/\($0.jobId)", thumbnailKey: "thumbnails/\($0.jobId)")) }))
            // Then each is recorded, the acknowledgements come several to a message, and every
            // job is completed with its result
            let (acknowledged, largestRecorded) = await collectAttempts(inbox, count: ids.count) { if case .recorded(let attempt) = $0 { attempt } else { nil } }
            #expect(Set(acknowledged) == Set(attempts))
            #expect(largestRecorded > 1, "every acknowledgement came alone")
            for id in ids {
                let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: id, userId: user))
                #expect(job.status == .completed && job.resultKey == "results/\(id)")
            }
        }
        await system.stop()
    }

    @Test func aKillOfJobsBetweenBatchesLosesNoResultItAcknowledged() async throws {
        let system = try await JobSystem(workers: 0)
        let (user, ids) = try await queuedJobs(200, effect: "copy", in: system)
        // Given a hand-driven worker holding all 200 jobs
        let worker = BusChannel.connecting(system.workerEndpoint)
        try await worker.running {
            let inbox = Inbox(worker)
            worker.send(WorkerMessage.ready(WorkerReady(workerId: "burst", capacity: 200, effects: ["*"])))
            let (attempts, _) = await collectAttempts(inbox, count: ids.count) { if case .assign(let assignment) = $0 { assignment.attempt } else { nil } }
            #expect(attempts.count == ids.count)
            let held = attempts
            let beating = heartbeats(from: worker, naming: held)
            defer { beating.cancel() }
            // When it sends every result at once and jobs is killed (-9) as the first acknowledgements
            // come back, between group-committed batches
            for attempt in attempts {
                worker.send(WorkerMessage.done(attempt, JobOutput(resultKey: "results/\(attempt.jobId)", thumbnailKey: "thumbnails/\(attempt.jobId)")))
            }
            let first = await next(inbox, within: .seconds(10)) { if case .recorded(let attempt) = $0 { return attempt } else { return nil } }
            let jobs = try #require(system.services.processes[.jobs])
            jobs.signal(SIGKILL)
            _ = try await jobs.waitForExit()
            var acknowledged = Set([first].compactMap { $0 })
            while let attempt = await inbox.take({ if case .recorded(let attempt) = $0 { return attempt } else { return nil } }) {
                acknowledged.insert(attempt)
            }
            // Then after a restart every result it acknowledged is there, completed
            try system.services.restart(.jobs)
            _ = try await waitUntilHealthy(system.clients.jobs)
            #expect(!acknowledged.isEmpty)
            for attempt in acknowledged {
                let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: attempt.jobId, userId: user))
                #expect(job.status == .completed && job.resultKey == "results/\(attempt.jobId)", "acknowledged \(attempt.jobId) is \(job.status)")
            }
        }
        await system.stop()
    }

    @Test func aSilentWorkerIsDeclaredDeadAfterThreeOfItsOwnIntervals() async throws {
        let system = try await JobSystem(workers: 0)
        let user = "device:\(UUID().uuidString.lowercased())"
        let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: "copy"))
        // Given a hand-driven worker announcing a 2 s heartbeat, that takes the job and goes silent
        let silent = BusChannel.connecting(system.workerEndpoint)
        try await silent.running {
            let silentInbox = Inbox(silent)
            // (The service counts from the last message it heard, the ready: timed from before it
            // is sent, so the bound below cannot be met early by the assignment's own trip.)
            let lastSent = ContinuousClock.now
            silent.send(WorkerMessage.ready(WorkerReady(workerId: "slow-silent", capacity: 1, effects: ["*"], heartbeatMilliseconds: 2000)))
            let first = await next(silentInbox) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            #expect(first == JobAttempt(jobId: job.id, attempt: 1))
            // When another worker is ready
            let other = BusChannel.connecting(system.workerEndpoint)
            try await other.running {
            let otherInbox = Inbox(other)
            other.send(WorkerMessage.ready(WorkerReady(workerId: "other", capacity: 1, effects: ["*"])))
            let beating = heartbeats(from: other, naming: [])
            defer { beating.cancel() }
            // Then the job goes to it once the silent one has missed three of its 2 s heartbeats,
            // not three of the service's 1 s ones. (The exact moment, with time passed in, is
            // `DispatchStateMachineTests.aWorkerIsDeadAfterThreeOfItsOwnIntervalsNotTheServices`;
            // here the upper bound only says the job is taken back at all, on a machine of any
            // speed, so it is five times the 6 s.)
            let second = await next(otherInbox, within: .seconds(40)) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            let waited = lastSent.duration(to: .now)
            #expect(second == JobAttempt(jobId: job.id, attempt: 2))
            #expect(waited >= .seconds(6), "the job was taken back after \(waited)")
            #expect(waited < .seconds(30), "the job was taken back after \(waited)")
            }
        }
        await system.stop()
    }

    @Test func silentWorkerLosesItsJobAndItsLateResultIsRefused() async throws {
        let system = try await JobSystem(workers: 0)
        let user = "device:\(UUID().uuidString.lowercased())"
        let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: "copy"))
        // Given a hand-driven worker announcing 100 ms heartbeats that takes the job and then goes
        // silent (the state machine's tests cover the timing; this one, the processes)
        let first = BusChannel.connecting(system.workerEndpoint)
        try await first.running {
            let firstInbox = Inbox(first)
            first.send(WorkerMessage.ready(WorkerReady(workerId: "silent", capacity: 1, effects: ["*"], heartbeatMilliseconds: 100)))
            let attempt1 = await next(firstInbox) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            #expect(attempt1 == JobAttempt(jobId: job.id, attempt: 1))
        }
        // When it has been silent for more than three of its intervals, the job is queued again
        try await waitUntil {
            try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user)).status == .queued
        }
        // And another worker takes the job as attempt 2
        let second = BusChannel.connecting(system.workerEndpoint)
        try await second.running {
            let secondInbox = Inbox(second)
            second.send(WorkerMessage.ready(WorkerReady(workerId: "second", capacity: 1, effects: ["*"])))
            let attempt2 = await next(secondInbox) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            #expect(attempt2 == JobAttempt(jobId: job.id, attempt: 2))
            // Then attempt 1's late result is refused, and attempt 2's accepted
            second.send(WorkerMessage.done(JobAttempt(jobId: job.id, attempt: 1), JobOutput(resultKey: "stale", thumbnailKey: "stale")))
            let refused = await next(secondInbox) { if case .refused(let attempt, _) = $0 { return attempt } else { return nil } }
            #expect(refused == JobAttempt(jobId: job.id, attempt: 1))
            second.send(WorkerMessage.done(JobAttempt(jobId: job.id, attempt: 2), JobOutput(resultKey: "fresh", thumbnailKey: "fresh-thumb")))
            try await waitUntil {
                try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user)).status == .completed
            }
            let done = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user))
            #expect(done.resultKey == "fresh" && done.attempts == 2)
            // And garbage on the worker endpoint changes nothing
            second.send(Array("not a message".utf8))
            second.send(WorkerMessage.done(JobAttempt(jobId: "no-such-job", attempt: 1), JobOutput(resultKey: "x", thumbnailKey: "y")))
            #expect(try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user)).resultKey == "fresh")
        }
        await system.stop()
    }

    @Test func anAssignmentItsWorkerDoesNotHoldIsQueuedAgainAndResultsAreAcknowledged() async throws {
        let system = try await JobSystem(workers: 0)
        let user = "device:\(UUID().uuidString.lowercased())"
        let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: "copy"))
        // Given a live worker whose heartbeats never name the attempt it was assigned (the
        // assignment was lost on the way)
        let worker = BusChannel.connecting(system.workerEndpoint)
        try await worker.running {
            let inbox = Inbox(worker)
            worker.send(WorkerMessage.ready(WorkerReady(workerId: "forgetful", capacity: 1, effects: ["*"])))
            let first = await next(inbox) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            #expect(first == JobAttempt(jobId: job.id, attempt: 1))
            let beating = heartbeats(from: worker, naming: [])
            // Then after three heartbeat intervals the job is queued again and handed out anew
            let second = await next(inbox) { if case .assign(let assignment) = $0 { return assignment.attempt } else { return nil } }
            beating.cancel()
            #expect(second == JobAttempt(jobId: job.id, attempt: 2))
            // And a result is acknowledged once durably recorded
            let output = JobOutput(resultKey: "r", thumbnailKey: "t")
            worker.send(WorkerMessage.done(JobAttempt(jobId: job.id, attempt: 2), output))
            let recorded = await next(inbox) { if case .recorded(let attempt) = $0 { return attempt } else { return nil } }
            #expect(recorded == JobAttempt(jobId: job.id, attempt: 2))
            // And the same result sent again (its acknowledgement lost) changes nothing and is
            // acknowledged again as recorded (not refused: it was not wrong, only late)
            worker.send(WorkerMessage.done(JobAttempt(jobId: job.id, attempt: 2), output))
            let answered = await next(inbox) { if case .recorded(let attempt) = $0 { return attempt } else { return nil } }
            #expect(answered == JobAttempt(jobId: job.id, attempt: 2))
            // While a different result for the same attempt is refused
            worker.send(WorkerMessage.done(JobAttempt(jobId: job.id, attempt: 2), JobOutput(resultKey: "other", thumbnailKey: "other-t")))
            let refused = await next(inbox) { if case .refused(let attempt, _) = $0 { return attempt } else { return nil } }
            #expect(refused == JobAttempt(jobId: job.id, attempt: 2))
            let done = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user))
            #expect(done.status == .completed && done.resultKey == "r" && done.attempts == 2)
        }
        await system.stop()
    }

    @Test func aProcessingJobNobodyHoldsGoesBackToTheQueueAndCompletes() async throws {
        let system = try await JobSystem(workers: 0)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let created = JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy"))
            let jobId = try #require(created["jobId"] as? String)
            // Given the database says the job is processing, but no worker holds it (as after a
            // write that failed half-way through the protocol, or an assignment lost in a restart)
            let database = try DatabaseQueue(path: system.services.dataDirectory.appendingPathComponent("jobs.sqlite").path)
            try await database.write { db in
                try db.execute(sql: "UPDATE job SET status = 'processing', attempts = attempts + 1, version = version + 1 WHERE id = ?", arguments: [jobId])
            }
            try database.close()
            try system.startWorker()
            // Then within seconds it is queued again, a worker runs it, and its charge is committed
            let done = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(20))
            #expect(done["status"] as? String == "completed")
            let userId = "device:\(user[.deviceId]!.lowercased())"
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
                return usage.charges.first { $0.jobId == jobId }?.state == .committed
            }
            let record = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: userId))
            #expect(record.attempts == 2)
        }
        await system.stop()
    }
}
