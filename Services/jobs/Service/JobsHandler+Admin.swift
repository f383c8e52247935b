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
