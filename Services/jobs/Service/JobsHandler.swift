import Bus
import Foundation
import JobsCore
import Messages

/// The jobs service's bus methods.
public struct JobsHandler: Sendable {
    let store: any JobsStore
    let dispatcher: any JobDispatch
    let catalog: EffectCatalog
    let maxQueued: Int
    /// Quota, for an operator's retry (which reserves a failed job's credits again); nil: retries
    /// answer `unavailable`.
    let quota: BusClient?
    /// The attempts a retried job gets (`JOBS_MAX_ATTEMPTS`).
    let retryAttempts: Int

    public init(store: any JobsStore, dispatcher: any JobDispatch, catalog: EffectCatalog, maxQueued: Int = 100_000,
                quota: BusClient? = nil, retryAttempts: Int = RetryPolicy().maxAttempts) {
        self.store = store
        self.dispatcher = dispatcher
        self.catalog = catalog
        self.maxQueued = maxQueued
        self.quota = quota
        self.retryAttempts = retryAttempts
    }

    public func register(on router: inout BusRouter) {
        router.register(Jobs.create) { request, _ in
            // The job joins the trace of this request (the handler's span), if any.
            var request = request
            let traceParent = BusTracing.currentTraceParent()
            request.traceParent = traceParent.isEmpty ? nil : traceParent
            return try await create(request)
        }
        router.register(Jobs.get) { request, _ in
            guard let job = try await store.job(request.jobId, userId: request.userId) else {
                throw BusError(.notFound, "no job \(request.jobId.prefix(64))")
            }
            return await dispatcher.withLiveProgress(job)
        }
        router.register(Jobs.cancel) { request, _ in
            let job = try await store.cancel(request.jobId, userId: request.userId, now: Date())
            await dispatcher.cancel(job)
            return job
        }
        router.register(Jobs.lookup) { request, _ in
            let status = try await store.lookup(request.jobId, abandonIfAbsent: request.abandonIfAbsent, now: Date())
            // An ended job's end: quota's resolver tells a charge made after it from the job's own.
            let finishedAt = status?.isTerminal == true ? try await store.job(request.jobId, userId: nil)?.finishedAt : nil
            return JobExistence(exists: status != nil, status: status, finishedAt: finishedAt)
        }
        router.register(Jobs.purge) { request, _ in
            let purge = try await store.purge(request.jobId, userId: request.userId, now: Date())
            if let job = purge.job, !job.status.isTerminal { await dispatcher.cancel(job) }
            return JobPurged(existed: purge.job != nil)
        }
        router.register(Jobs.watch) { request, _ in try await watch(request) }
        router.register(Jobs.providerCallback) { request, _ in
            // Only a job that waits on a provider request (the one named, when the webhook names
            // one) is poked; anything else changes nothing. The result itself is never taken
            // from a webhook: the worker asks the provider.
            guard let job = try await store.job(request.jobId, userId: nil), job.status == .processing, let submission = job.submission,
                  request.requestId == nil || request.requestId == submission.requestId else { return Empty() }
            await dispatcher.poke(jobId: job.id)
            return Empty()
        }
        registerAdmin(on: &router)
        router.register(Devices.put) { request, _ in
            guard DeviceRegistration.isValid(token: request.token), !request.userId.isEmpty else {
                throw BusError(.badRequest, "a device token is 1 to \(Devices.maxTokenLength) letters, digits and -_:.")
            }
            return try await store.putDevice(request, now: Date())
        }
        router.register(Devices.delete) { request, _ in
            guard try await store.deleteDevice(userId: request.userId, token: request.token) else {
                throw BusError(.notFound, "no such device")
            }
            return Empty()
        }
        router.register(Jobs.effects) { _, _ in
            EffectList(
                effects: catalog.effects.values.filter { $0.processor != "noop" }.sorted { $0.id < $1.id },
                aliases: catalog.aliases.filter { catalog.effects[$0.key] == nil }
            )
        }
    }

    /// Reads only each watched job's owner, version, status and progress (a stream's job
    /// rarely changes between two rounds), then the whole record of those that changed.
    func watch(_ request: WatchJobs) async throws -> WatchedJobs {
        guard request.jobs.count <= WatchJobs.maxJobs else {
            throw BusError(.badRequest, "watch at most \(WatchJobs.maxJobs) jobs a call")
        }
        let states = try await store.states(request.jobs.map(\.jobId))
        let live = await dispatcher.liveProgress(of: request.jobs.map(\.jobId))
        var changed: [String] = [], gone: [String] = []
        for seen in request.jobs {
            guard let state = states[seen.jobId], state.userId == seen.userId else {
                gone.append(seen.jobId)
                continue
            }
            let progress = state.status == .processing ? live[seen.jobId] ?? state.progress : state.progress
            if state.version != seen.version || progress != seen.progress { changed.append(seen.jobId) }
        }
        let records = await dispatcher.withLiveProgress(try await store.jobs(changed))
        return WatchedJobs(changed: records, gone: gone)
    }

    func create(_ request: CreateJob) async throws -> JobRecord {
        for (name, value) in [("job id", request.jobId), ("user id", request.userId), ("image key", request.imageKey)] {
            guard (1...256).contains(value.utf8.count) else { throw BusError(.badRequest, "\(name) must be 1 to 256 bytes") }
        }
        if let prompt = request.prompt, prompt.utf8.count > 2000 {
            throw BusError(.badRequest, "prompt must be at most 2,000 bytes")
        }
        guard (1...1000).contains(request.credits) else { throw BusError(.badRequest, "credits must be 1 to 1000") }
        let (effect, parameters) = try catalog.resolve(request.effectId, parameters: request.parameters)
        guard await dispatcher.queuedCount < maxQueued else {
            throw BusError(Jobs.ErrorCode.queueFull, "\(maxQueued) jobs are queued; try again later", retryable: true)
        }
        let (job, created) = try await store.create(request, effectId: effect.id, parameters: parameters, now: Date())
        if created { await dispatcher.enqueue(job) }
        return job
    }
}
