import Foundation

/// The jobs service's methods for operators: jobs across all users, and the audit log of what
/// operators did.
public enum Admin {
    /// A page of jobs across all users matching a filter, newest first, with the counts by state.
    public static let jobs = BusMethod<AdminJobsQuery, AdminJobsPage>("jobs.admin-jobs", roles: [.gateway, .operator], retrySafe: true)
    /// One job, whoever's (else `not_found`).
    public static let job = BusMethod<AdminJobReference, JobRecord>("jobs.admin-job", roles: [.gateway, .operator], retrySafe: true)
    /// Cancels the jobs named, or those matching a filter (at most `AdminJobsAction.maxJobs`);
    /// idempotent: a job already ended is not changed. Written to the audit log.
    public static let cancel = BusMethod<AdminJobsAction, AdminActionResult>("jobs.admin-cancel", roles: [.gateway, .operator], retrySafe: true)
    /// Runs failed jobs again, those named or matching a filter: each with the same id, its
    /// credits reserved again through quota first (a user without credits left is not retried).
    /// Idempotent: a job no longer failed is not changed. Written to the audit log.
    public static let retry = BusMethod<AdminJobsAction, AdminActionResult>("jobs.admin-retry", roles: [.gateway, .operator], retrySafe: true)
    /// The queue by effect and provider, the providers' limits and jobs in flight, the workers,
    /// the controls in force, and the last hour's outcomes.
    public static let overview = BusMethod<Empty, AdminOverview>("jobs.admin-overview", roles: [.gateway, .operator], retrySafe: true)
    /// Pauses or resumes an effect or a provider, sets a provider's concurrency, drains or
    /// undrains a worker: stored, then in force. Idempotent; written to the audit log.
    public static let control = BusMethod<AdminControl, DispatchControls>("jobs.admin-control", roles: [.gateway, .operator], retrySafe: true)
    /// A job's attempts, first to last: the worker, start, end, outcome and error of each.
    public static let attempts = BusMethod<AdminJobReference, [AttemptRecord]>("jobs.admin-attempts", roles: [.gateway, .operator], retrySafe: true)
    /// Writes an entry to the audit log (an action taken elsewhere, such as a plan change).
    public static let audit = BusMethod<AuditEntry, Empty>("jobs.audit-append", roles: [.gateway, .operator], retrySafe: false)
    /// The audit log, newest first.
    public static let auditLog = BusMethod<AuditQuery, AuditPage>("jobs.audit-log", roles: [.gateway, .operator], retrySafe: true)
}

/// What operators set on dispatching, kept in the jobs store so that a restart or a new leader
/// keeps it: effects and providers whose queued jobs wait (paused: they stay queued, none is lost),
/// providers' concurrency set live (over `JOBS_PROVIDER_CONCURRENCY`), and workers drained (they
/// finish what they hold and are given nothing new, across reconnects).
public struct DispatchControls: Codable, Sendable, Equatable {
    public var pausedEffects: [String]
    public var pausedProviders: [String]
    /// Provider to the most of its jobs held by workers at once.
    public var providerLimits: [String: Int]
    /// Worker ids.
    public var drainedWorkers: [String]
    /// The most workers drained at once (effects and providers are the catalogue's).
    public static let maxEntries = 1000

    public init(pausedEffects: [String] = [], pausedProviders: [String] = [], providerLimits: [String: Int] = [:], drainedWorkers: [String] = []) {
        self.pausedEffects = pausedEffects
        self.pausedProviders = pausedProviders
        self.providerLimits = providerLimits
        self.drainedWorkers = drainedWorkers
    }

    /// One change an operator makes.
    public enum Change: Codable, Sendable, Equatable {
        case pauseEffect(String), resumeEffect(String)
        case pauseProvider(String), resumeProvider(String)
        /// nil: back to the configured limit.
        case providerLimit(String, Int?)
        case drain(String), undrain(String)
    }

    /// These controls with `change` made; nil if it changes nothing.
    public func applying(_ change: Change) -> DispatchControls? {
        var next = self
        func insert(_ value: String, _ list: inout [String]) { if !list.contains(value) { list.append(value); list.sort() } }
        switch change {
        case .pauseEffect(let effect): insert(effect, &next.pausedEffects)
        case .resumeEffect(let effect): next.pausedEffects.removeAll { $0 == effect }
        case .pauseProvider(let provider): insert(provider, &next.pausedProviders)
        case .resumeProvider(let provider): next.pausedProviders.removeAll { $0 == provider }
        case .providerLimit(let provider, let limit): next.providerLimits[provider] = limit
        case .drain(let worker): insert(worker, &next.drainedWorkers)
        case .undrain(let worker): next.drainedWorkers.removeAll { $0 == worker }
        }
        return next == self ? nil : next
    }
}

/// One minute's jobs ended; `minute` is minutes since 1970.
public struct OutcomeMinute: Codable, Sendable, Equatable {
    public var minute: Int
    public var completed: Int
    public var failed: Int
    public init(minute: Int, completed: Int = 0, failed: Int = 0) {
        self.minute = minute
        self.completed = completed
        self.failed = failed
    }
}

/// The queue, the providers and the workers now, for the console.
public struct AdminOverview: Codable, Sendable, Equatable {
    public struct Effect: Codable, Sendable, Equatable {
        public var effect: String
        public var provider: String
        public var queued: Int
        public var processing: Int
        public var oldestQueuedAt: Date?
        public var paused: Bool
        public init(effect: String, provider: String, queued: Int, processing: Int, oldestQueuedAt: Date?, paused: Bool) {
            self.effect = effect
            self.provider = provider
            self.queued = queued
            self.processing = processing
            self.oldestQueuedAt = oldestQueuedAt
            self.paused = paused
        }
    }

    public struct Provider: Codable, Sendable, Equatable {
        public var provider: String
        public var queued: Int
        public var processing: Int
        public var oldestQueuedAt: Date?
        /// Jobs held by workers now (nil: not known on this replica).
        public var inFlight: Int?
        /// The most held at once; nil: no limit.
        public var limit: Int?
        /// Whether the limit is an operator's, set live (else `JOBS_PROVIDER_CONCURRENCY`).
        public var limitSetLive: Bool
        public var paused: Bool
        /// Waits the provider asked for (429, `Retry-After`) and refusals for safety, over the
        /// connected workers since each started (nil: not known on this replica).
        public var rateLimitWaits: Int?
        public var refusals: Int?
        public init(provider: String, queued: Int, processing: Int, oldestQueuedAt: Date?, inFlight: Int?, limit: Int?, limitSetLive: Bool, paused: Bool,
                    rateLimitWaits: Int? = nil, refusals: Int? = nil) {
            self.rateLimitWaits = rateLimitWaits
            self.refusals = refusals
            self.provider = provider
            self.queued = queued
            self.processing = processing
            self.oldestQueuedAt = oldestQueuedAt
            self.inFlight = inFlight
            self.limit = limit
            self.limitSetLive = limitSetLive
            self.paused = paused
        }
    }

    public struct Worker: Codable, Sendable, Equatable {
        public var id: String
        public var host: String?
        public var version: String?
        public var capacity: Int
        public var prefetch: Int
        public var effects: [String]
        public var running: Int
        public var awaiting: Int
        public var drained: Bool
        public var leaving: Bool
        public var lastHeartbeat: Date
        public init(id: String, host: String?, version: String?, capacity: Int, prefetch: Int, effects: [String], running: Int, awaiting: Int,
                    drained: Bool, leaving: Bool, lastHeartbeat: Date) {
            self.id = id
            self.host = host
            self.version = version
            self.capacity = capacity
            self.prefetch = prefetch
            self.effects = effects
            self.running = running
            self.awaiting = awaiting
            self.drained = drained
            self.leaving = leaving
            self.lastHeartbeat = lastHeartbeat
        }
    }

    /// Every job by state.
    public var counts: [String: Int]
    public var effects: [Effect]
    public var providers: [Provider]
    public var workers: [Worker]
    public var controls: DispatchControls
    /// Jobs ended each minute of the last hour (empty on a replica that does not dispatch).
    public var lastHour: [OutcomeMinute]
    /// Whether this replica dispatches (workers, in-flight counts and the last hour are its).
    public var dispatching: Bool
    public init(counts: [String: Int], effects: [Effect], providers: [Provider], workers: [Worker], controls: DispatchControls,
                lastHour: [OutcomeMinute], dispatching: Bool) {
        self.counts = counts
        self.effects = effects
        self.providers = providers
        self.workers = workers
        self.controls = controls
        self.lastHour = lastHour
        self.dispatching = dispatching
    }
}

/// An operator's change to dispatching.
public struct AdminControl: Codable, Sendable, Equatable {
    public var change: DispatchControls.Change
    public var actor: String
    public init(change: DispatchControls.Change, actor: String) {
        self.change = change
        self.actor = actor
    }
}

/// Which jobs: every field set narrows it.
public struct AdminJobFilter: Codable, Sendable, Equatable {
    public var state: JobStatus?
    public var effect: String?
    /// The provider of the job's effect (`gemini`, `openai`, `fal`, `remote`, or `none` for the
    /// built-in effects).
    public var provider: String?
    public var userId: String?
    /// Text the job's last error contains (case-insensitive).
    public var error: String?
    /// Created at or after.
    public var from: Date?
    /// Created before.
    public var to: Date?

    public init(state: JobStatus? = nil, effect: String? = nil, provider: String? = nil, userId: String? = nil, error: String? = nil,
                from: Date? = nil, to: Date? = nil) {
        self.state = state
        self.effect = effect
        self.provider = provider
        self.userId = userId
        self.error = error
        self.from = from
        self.to = to
    }
}

/// A page of jobs: `cursor` is the last page's `nextCursor`.
public struct AdminJobsQuery: Codable, Sendable, Equatable {
    public var filter: AdminJobFilter
    public var cursor: String?
    public var limit: Int
    public static let maxLimit = 200
    public init(filter: AdminJobFilter, cursor: String? = nil, limit: Int = 50) {
        self.filter = filter
        self.cursor = cursor
        self.limit = limit
    }
}

public struct AdminJobsPage: Codable, Sendable, Equatable {
    public var jobs: [JobRecord]
    /// The next page's cursor; nil on the last page.
    public var nextCursor: String?
    /// Every job by state (not only the filter's).
    public var counts: [String: Int]
    public init(jobs: [JobRecord], nextCursor: String?, counts: [String: Int]) {
        self.jobs = jobs
        self.nextCursor = nextCursor
        self.counts = counts
    }
}

/// An action on the jobs named, or on those matching a filter.
public struct AdminJobsAction: Codable, Sendable, Equatable {
    public var ids: [String]?
    public var filter: AdminJobFilter?
    /// Who acts, for the audit log (`admin`).
    public var actor: String
    /// The most jobs one action changes: a filter matching more changes the oldest this many.
    public static let maxJobs = 1000
    public init(ids: [String]? = nil, filter: AdminJobFilter? = nil, actor: String) {
        self.ids = ids
        self.filter = filter
        self.actor = actor
    }
}

public struct AdminActionResult: Codable, Sendable, Equatable {
    /// The jobs the ids or the filter named.
    public var matched: Int
    /// The jobs the action changed (the others were already as asked).
    public var changed: Int
    /// A retry: the jobs quota refused to charge again (their users have no credits left).
    public var denied: Int?
    /// A retry: failed jobs whose release has not reached quota yet (retry them again shortly).
    public var settling: Int?
    public init(matched: Int, changed: Int, denied: Int? = nil, settling: Int? = nil) {
        self.matched = matched
        self.changed = changed
        self.denied = denied
        self.settling = settling
    }
}

/// One operator action, as the audit log keeps it.
public struct AuditEntry: Codable, Sendable, Equatable {
    public var id: Int64?
    public var at: Date
    /// Who acted (`admin`).
    public var actor: String
    /// What: `jobs.cancel`, `users.plan`, ...
    public var action: String
    /// Whom or what: a user id, job ids, or `filter`.
    public var target: String
    /// The filter it applied, as JSON, if any.
    public var filter: String?
    /// How many jobs (or other things) it changed.
    public var count: Int
    public var detail: String?
    public init(id: Int64? = nil, at: Date, actor: String, action: String, target: String, filter: String? = nil, count: Int, detail: String? = nil) {
        self.id = id
        self.at = at
        self.actor = actor
        self.action = action
        self.target = target
        self.filter = filter
        self.count = count
        self.detail = detail
    }
}

public struct AuditQuery: Codable, Sendable, Equatable {
    /// Entries older than this id (the last page's last).
    public var before: Int64?
    public var limit: Int
    public init(before: Int64? = nil, limit: Int = 100) {
        self.before = before
        self.limit = limit
    }
}

public struct AuditPage: Codable, Sendable, Equatable {
    public var entries: [AuditEntry]
    public init(entries: [AuditEntry]) { self.entries = entries }
}

/// One attempt at a job, as the jobs store keeps it.
public struct AttemptRecord: Codable, Sendable, Equatable {
    public var attempt: Int
    /// The worker it was handed to (nil: not known, an attempt started before attempts were kept).
    public var workerId: String?
    public var startedAt: Date
    /// When it ended, and how: `completed`, `failed`, `cancelled`, or `retry` (it failed and the
    /// job was queued again); nil while it runs.
    public var endedAt: Date?
    public var outcome: String?
    public var error: String?
    public init(attempt: Int, workerId: String?, startedAt: Date, endedAt: Date? = nil, outcome: String? = nil, error: String? = nil) {
        self.attempt = attempt
        self.workerId = workerId
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.outcome = outcome
        self.error = error
    }

    /// How an attempt ended, by the state its job went to (nil: it has not ended).
    public static func outcome(of status: JobStatus) -> String? {
        switch status {
        case .processing: nil
        case .queued: "retry"
        case .completed, .failed, .cancelled: status.rawValue
        }
    }
}

/// Names a job for an operator (no user check).
public struct AdminJobReference: Codable, Sendable, Equatable {
    public var jobId: String
    public init(jobId: String) { self.jobId = jobId }
}
