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
    /// Writes an entry to the audit log (an action taken elsewhere, such as a plan change).
    public static let audit = BusMethod<AuditEntry, Empty>("jobs.audit-append", roles: [.gateway, .operator], retrySafe: false)
    /// The audit log, newest first.
    public static let auditLog = BusMethod<AuditQuery, AuditPage>("jobs.audit-log", roles: [.gateway, .operator], retrySafe: true)
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

/// Names a job for an operator (no user check).
public struct AdminJobReference: Codable, Sendable, Equatable {
    public var jobId: String
    public init(jobId: String) { self.jobId = jobId }
}
