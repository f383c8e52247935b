import Bus
import Foundation
import JobsCore
import Messages

/// The operators' methods: jobs across users, batch cancels, and the audit log.
extension JobsHandler {
    func registerAdmin(on router: inout BusRouter) {
        router.register(Admin.jobs) { request, _ in
            let limit = min(max(1, request.limit), AdminJobsQuery.maxLimit)
            var cursor: AdminCursor?
            if let text = request.cursor {
                guard let parsed = AdminCursor(text: text) else { throw BusError(.badRequest, "the cursor is not one this service gave") }
                cursor = parsed
            }
            let jobs = try await store.adminJobs(request.filter, effectIds: effectIds(of: request.filter.provider), after: cursor, limit: limit + 1)
            let counts = try await store.counts()
            return AdminJobsPage(
                jobs: Array(jobs.prefix(limit)), nextCursor: jobs.count > limit ? AdminCursor(after: jobs[limit - 1]).text : nil,
                counts: Dictionary(uniqueKeysWithValues: JobStatus.allCases.map { ($0.rawValue, counts.states[$0] ?? 0) })
            )
        }
        router.register(Admin.job) { request, _ in
            guard let job = try await store.job(request.jobId, userId: nil) else { throw BusError(.notFound, "no job \(request.jobId.prefix(64))") }
            return await dispatcher.withLiveProgress(job)
        }
        router.register(Admin.cancel) { request, _ in
            let jobs = try await selected(request)
            var changed = 0
            for job in jobs where !job.status.isTerminal && !job.cancelRequested {
                do {
                    let cancelled = try await store.cancel(job.id, userId: job.userId, now: Date())
                    await dispatcher.cancel(cancelled)
                    changed += 1
                } catch let error as BusError where error.code == Jobs.ErrorCode.alreadyFinished || error.code == .notFound {
                    // Ended (or purged) meanwhile: nothing to cancel.
                }
            }
            try await audit(request, "jobs.cancel", count: changed)
            return AdminActionResult(matched: jobs.count, changed: changed)
        }
        router.register(Admin.retry) { request, _ in try await retry(request) }
        router.register(Admin.overview) { _, _ in try await overview() }
        router.register(Admin.attempts) { request, _ in try await store.attempts(of: request.jobId) }
        router.register(Admin.control) { request, _ in try await control(request) }
        router.register(Admin.audit) { request, _ in
            try await store.appendAudit(request)
            return Empty()
        }
        router.register(Admin.auditLog) { request, _ in
            AuditPage(entries: try await store.auditLog(before: request.before, limit: min(max(1, request.limit), 500)))
        }
    }

    /// Failed jobs queued again, each once quota charged it again. A reservation left behind (the
    /// job changed between the charge and the retry) is one whose job is not running: the stale
    /// reservation resolver gives it back, as it does for a creation that never happened.
    func retry(_ request: AdminJobsAction) async throws -> AdminActionResult {
        guard let quota else { throw BusError(.unavailable, "this jobs service has no quota client to charge a retry") }
        let jobs = try await selected(request)
        var changed = 0, denied = 0, settling = 0
        for job in jobs where job.status == .failed {
            let decision = try await quota.call(Quota.reserve, ReserveQuota(userId: job.userId, jobId: job.id, cost: job.credits), timeout: .seconds(5))
            guard decision.admitted else {
                denied += 1
                continue
            }
            switch try await store.retry(job.id, attempts: retryAttempts, now: Date()) {
            case .retried(let queued):
                await dispatcher.enqueue(queued)
                changed += 1
            case .settling: settling += 1
            case .notFailed: break
            }
        }
        try await audit(request, "jobs.retry", count: changed, detail: denied + settling > 0 ? "\(denied) denied by quota, \(settling) still settling" : nil)
        return AdminActionResult(matched: jobs.count, changed: changed, denied: denied, settling: settling)
    }

    /// The queue, providers and workers now. Workers, jobs in flight and the last hour come from
    /// the dispatcher: on a PostgreSQL replica that does not lead, they are left out
    /// (`dispatching` false) and the rest is read from the store.
    func overview() async throws -> AdminOverview {
        let loads = try await store.activeByEffect()
        let counts = try await store.counts()
        let live = await dispatcher.live()
        let controls: DispatchControls
        if let live { controls = live.controls } else { controls = try await store.dispatchControls() }
        func provider(of effect: String) -> String { catalog.provider(of: effect) ?? "none" }
        let pausedEffects = Set(controls.pausedEffects), pausedProviders = Set(controls.pausedProviders)
        var loadByEffect = Dictionary(uniqueKeysWithValues: loads.map { ($0.effectId, $0) })
        for effect in catalog.effects.keys where loadByEffect[effect] == nil {
            loadByEffect[effect] = EffectLoad(effectId: effect, queued: 0, processing: 0, oldestQueuedAt: nil)
        }
        let effects = loadByEffect.values.sorted { $0.effectId < $1.effectId }.map { load in
            AdminOverview.Effect(effect: load.effectId, provider: provider(of: load.effectId), queued: load.queued, processing: load.processing,
                                 oldestQueuedAt: load.oldestQueuedAt, paused: pausedEffects.contains(load.effectId))
        }
        let limits = live?.providerLimits ?? controls.providerLimits
        // Since each connected worker started, from the metrics they send.
        let rateLimitWaits = live.map { ProviderCounters.sum("worker_provider_rate_limit_waits_total", in: $0.workerMetrics) }
        let refusals = live.map { ProviderCounters.sum("worker_provider_refusals_total", in: $0.workerMetrics) }
        let names = Set(effects.map(\.provider)).union(limits.keys).union(controls.pausedProviders)
        let providers = names.sorted().map { name in
            let mine = effects.filter { $0.provider == name }
            return AdminOverview.Provider(
                provider: name, queued: mine.reduce(0) { $0 + $1.queued }, processing: mine.reduce(0) { $0 + $1.processing },
                oldestQueuedAt: mine.compactMap(\.oldestQueuedAt).min(), inFlight: live.map { $0.activeByProvider[name] ?? 0 },
                limit: limits[name], limitSetLive: controls.providerLimits[name] != nil, paused: pausedProviders.contains(name),
                rateLimitWaits: rateLimitWaits.map { $0[name] ?? 0 }, refusals: refusals.map { $0[name] ?? 0 }
            )
        }
        let now = Date()
        let workers = (live?.workers ?? []).map { worker in
            AdminOverview.Worker(
                id: worker.id, host: worker.host, version: worker.version, capacity: worker.capacity, prefetch: worker.prefetch, effects: worker.effects,
                running: worker.running, awaiting: worker.awaiting, drained: worker.drained, leaving: worker.leaving,
                lastHeartbeat: now.addingTimeInterval(-Double(worker.silentFor.components.seconds) - Double(worker.silentFor.components.attoseconds) / 1e18)
            )
        }
        return AdminOverview(
            counts: Dictionary(uniqueKeysWithValues: JobStatus.allCases.map { ($0.rawValue, counts.states[$0] ?? 0) }), effects: effects,
            providers: providers, workers: workers, controls: controls, lastHour: live?.lastHour ?? [], dispatching: live != nil
        )
    }

    /// One change to dispatching: checked against what exists, stored, put in force, audited.
    func control(_ request: AdminControl) async throws -> DispatchControls {
        let providers = Set(catalog.effects.keys.map { catalog.provider(of: $0) ?? "none" })
        func effect(_ name: String) throws {
            guard catalog.effects[name] != nil else { throw BusError(.notFound, "no effect \(name.prefix(64))") }
        }
        func provider(_ name: String) throws {
            guard providers.contains(name) else {
                throw BusError(.notFound, "no provider \(name.prefix(64)); the effects' providers are \(providers.sorted().joined(separator: ", "))")
            }
        }
        let action: String, target: String
        var detail: String?
        switch request.change {
        case .pauseEffect(let name): try effect(name); (action, target) = ("dispatch.pause", "effect:" + name)
        case .resumeEffect(let name): try effect(name); (action, target) = ("dispatch.resume", "effect:" + name)
        case .pauseProvider(let name): try provider(name); (action, target) = ("dispatch.pause", "provider:" + name)
        case .resumeProvider(let name): try provider(name); (action, target) = ("dispatch.resume", "provider:" + name)
        case .providerLimit(let name, let limit):
            try provider(name)
            if let limit, !(1...10_000).contains(limit) { throw BusError(.badRequest, "a provider's concurrency is 1 to 10000") }
            (action, target) = ("dispatch.concurrency", "provider:" + name)
            detail = limit.map { "\($0)" } ?? "configured"
        case .drain(let worker):
            guard (1...256).contains(worker.utf8.count) else { throw BusError(.badRequest, "a worker id is 1 to 256 bytes") }
            // Effects and providers are the catalogue's; worker ids are anyone's: bounded here.
            let drained = try await store.dispatchControls().drainedWorkers
            guard drained.count < DispatchControls.maxEntries || drained.contains(worker) else {
                throw BusError(.badRequest, "\(DispatchControls.maxEntries) workers are drained already; undrain some first")
            }
            (action, target) = ("workers.drain", worker)
        case .undrain(let worker):
            guard (1...256).contains(worker.utf8.count) else { throw BusError(.badRequest, "a worker id is 1 to 256 bytes") }
            (action, target) = ("workers.undrain", worker)
        }
        let (controls, changed) = try await store.changeDispatchControls(request.change)
        if changed { await dispatcher.apply(controls) }
        try await store.appendAudit(AuditEntry(at: Date(), actor: request.actor, action: action, target: target, count: changed ? 1 : 0, detail: detail))
        return controls
    }

    /// Writes an action on jobs to the audit log.
    func audit(_ request: AdminJobsAction, _ action: String, count: Int, detail: String? = nil) async throws {
        try await store.appendAudit(AuditEntry(
            at: Date(), actor: request.actor, action: action, target: request.ids.map { Self.describe($0) } ?? "filter",
            filter: try request.filter.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }, count: count, detail: detail
        ))
    }

    /// The effects of a provider (`none`: the built-in ones); nil for any provider.
    func effectIds(of provider: String?) -> [String]? {
        guard let provider else { return nil }
        return catalog.effects.keys.filter { (catalog.provider(of: $0) ?? "none") == provider }.sorted()
    }

    /// The jobs an action names: its ids (at most `maxJobs`), or the newest `maxJobs` its filter matches.
    func selected(_ action: AdminJobsAction) async throws -> [JobRecord] {
        switch (action.ids, action.filter) {
        case (let ids?, nil):
            guard ids.count <= AdminJobsAction.maxJobs else { throw BusError(.badRequest, "at most \(AdminJobsAction.maxJobs) ids an action") }
            return try await store.jobs(ids)
        case (nil, let filter?):
            return try await store.adminJobs(filter, effectIds: effectIds(of: filter.provider), after: nil, limit: AdminJobsAction.maxJobs)
        default:
            throw BusError(.badRequest, "an action names either ids or a filter")
        }
    }

    /// Job ids as the audit log shows them: up to five, then how many more.
    static func describe(_ ids: [String]) -> String {
        ids.count <= 5 ? ids.joined(separator: ",") : ids.prefix(5).joined(separator: ",") + " and \(ids.count - 5) more"
    }
}
