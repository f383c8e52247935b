import BinaryWire
import Foundation

/// The history service's methods: the user's past edits (a read model fed by job events), search,
/// deletion, share links and the changes feed of offline clients.
public enum History {
    /// Applies job events from the jobs outbox, idempotently by (job id, version). Replying means
    /// every event in the batch is durable (or was already applied): jobs may drop them.
    public static let apply = BusMethod<JobEvents, EventsApplied>("history.apply", roles: [.jobs], retrySafe: true)
    /// A page of a user's items, newest first, filtered and searched, optionally in month sections.
    public static let list = BusMethod<ListHistory, HistoryPage>("history.list", roles: [.gateway, .operator], retrySafe: true)
    /// The same page with each item's JSON already written up to its URLs (`RenderedHistoryPage`):
    /// what the gateway's History screen answers, without decoding and encoding every item again.
    public static let page = BusMethod<ListHistory, RenderedHistoryPage>("history.page", roles: [.gateway, .operator], retrySafe: true)
    /// One of the user's items (`not_found` for anyone else's).
    public static let get = BusMethod<HistoryItemReference, HistoryItem>("history.get", roles: [.gateway, .operator], retrySafe: true)
    /// Deletes an item for good: gone from every read at once, the job and its files purged
    /// through jobs (retried until jobs acknowledges). Idempotent by its item: a delete sent again
    /// (its replica died before answering) finds the user's own tombstone and gets the same answer.
    public static let delete = BusMethod<HistoryItemReference, DeletedHistoryItem>("history.delete", roles: [.gateway, .operator], retrySafe: true)
    /// Everything that changed for a user since a token: upserts and deletions.
    public static let changes = BusMethod<ChangesSince, HistoryChanges>("history.changes", roles: [.gateway], retrySafe: true)
    /// Makes a public link to a completed item's result.
    public static let share = BusMethod<ShareItem, ShareGrant>("history.share", roles: [.gateway])
    /// Revokes every public link of an item.
    public static let unshare = BusMethod<HistoryItemReference, Empty>("history.unshare", roles: [.gateway], retrySafe: true)
    /// Resolves a public link (no user): the result it grants, or `not_found` once revoked,
    /// expired or deleted.
    public static let openShare = BusMethod<ShareToken, SharedResult>("history.open-share", roles: [.gateway], retrySafe: true)

    /// Error codes the history service answers with.
    public enum ErrorCode {
        /// A page cursor or changes token that this service did not issue for this user and query.
        public static let invalidCursor = BusError.Code("history.invalid_cursor")
        /// A changes token older than the deletions kept: list again from the beginning.
        public static let tokenExpired = BusError.Code("history.token_expired")
        /// The item has no result to share (it has not completed).
        public static let notShareable = BusError.Code("history.not_shareable")
    }
}

/// A job's state as jobs emits it to history: the whole record after each change, with the title
/// of its effect. Written and read by hand (`@BinaryMessage`) on the bus: the generic `Codable`
/// path of a delivery of 200 was 8% of history's CPU applying events in `make bench-gateway`.
@BinaryMessage
public struct JobEvent: Codable, Sendable, Equatable {
    public var job: JobRecord
    public var effectTitle: String

    public init(job: JobRecord, effectTitle: String) {
        self.job = job
        self.effectTitle = effectTitle
    }
}

/// A batch of job events, oldest first.
@BinaryMessage
public struct JobEvents: Codable, Sendable, Equatable {
    public var events: [JobEvent]
    public init(events: [JobEvent]) { self.events = events }
}

/// How many events of a batch changed an item (the rest were replays, older versions or jobs
/// deleted meanwhile).
public struct EventsApplied: Codable, Sendable, Equatable {
    public var applied: Int
    public init(applied: Int) { self.applied = applied }
}

/// The status the app shows: the app's enum has exactly these four, so a queued job is listed as
/// `processing`.
public enum HistoryStatus: String, Codable, BinaryStringEnum, Sendable, CaseIterable {
    case completed, processing, failed, cancelled

    /// The app's status of a job's status.
    public init(_ status: JobStatus) {
        switch status {
        case .queued, .processing: self = .processing
        case .completed: self = .completed
        case .failed: self = .failed
        case .cancelled: self = .cancelled
        }
    }

    /// The job statuses this app status covers.
    public var jobStatuses: [JobStatus] {
        switch self {
        case .processing: [.queued, .processing]
        case .completed: [.completed]
        case .failed: [.failed]
        case .cancelled: [.cancelled]
        }
    }
}

/// One past edit as history keeps it.
public struct HistoryItem: Codable, Sendable, Equatable {
    public var jobId: String
    public var userId: String
    public var effectId: String
    public var effectTitle: String
    public var prompt: String?
    public var status: JobStatus
    public var progress: Double
    public var createdAt: Date
    public var updatedAt: Date
    public var finishedAt: Date?
    public var resultKey: String?
    public var thumbnailKey: String?
    public var originalImageKey: String
    public var parameters: [String: Double]
    /// Credits the job uses: its charge while reserved or committed, 0 once released.
    public var cost: Int
    public var lastError: String?
    /// The job's version this item reflects.
    public var version: Int

    public init(
        jobId: String, userId: String, effectId: String, effectTitle: String, prompt: String?, status: JobStatus,
        progress: Double, createdAt: Date, updatedAt: Date, finishedAt: Date?, resultKey: String?, thumbnailKey: String?,
        originalImageKey: String, parameters: [String: Double], cost: Int, lastError: String?, version: Int
    ) {
        self.jobId = jobId
        self.userId = userId
        self.effectId = effectId
        self.effectTitle = effectTitle
        self.prompt = prompt
        self.status = status
        self.progress = progress
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.finishedAt = finishedAt
        self.resultKey = resultKey
        self.thumbnailKey = thumbnailKey
        self.originalImageKey = originalImageKey
        self.parameters = parameters
        self.cost = cost
        self.lastError = lastError
        self.version = version
    }
}

/// Names one of a user's items.
public struct HistoryItemReference: Codable, Sendable, Equatable {
    public var userId: String
    public var jobId: String
    public init(userId: String, jobId: String) {
        self.userId = userId
        self.jobId = jobId
    }
}

/// Asks for a page of a user's history. Written and read by hand (`@BinaryMessage`): its generic
/// `Codable` decoding was 1.4% of the machine in history serving pages (`make bench-history`).
@BinaryMessage
public struct ListHistory: Codable, Sendable, Equatable {
    public var userId: String
    /// 1 to 100.
    public var limit: Int
    /// Items to skip (the seeds' paging); ignored when `cursor` is given.
    public var offset: Int
    /// A `nextCursor` of an earlier page of the same query.
    public var cursor: String?
    /// Only these statuses; empty means all.
    public var statuses: [HistoryStatus]
    /// A substring of the prompt or the effect title, case-insensitive.
    public var query: String?
    /// Adds month sections to the page.
    public var groupByMonth: Bool
    /// The IANA zone months are cut in (nil: UTC) and the locale of section titles (nil: English).
    public var timeZone: String?
    public var locale: String?

    public init(
        userId: String, limit: Int = 50, offset: Int = 0, cursor: String? = nil, statuses: [HistoryStatus] = [],
        query: String? = nil, groupByMonth: Bool = false, timeZone: String? = nil, locale: String? = nil
    ) {
        self.userId = userId
        self.limit = limit
        self.offset = offset
        self.cursor = cursor
        self.statuses = statuses
        self.query = query
        self.groupByMonth = groupByMonth
        self.timeZone = timeZone
        self.locale = locale
    }
}

/// A calendar month of a page's items, in the user's zone.
public struct HistorySection: Codable, Sendable, Equatable {
    /// `2025-11`.
    public var month: String
    /// `November 2025`, in the requested language.
    public var title: String
    public var items: [HistoryItem]

    public init(month: String, title: String, items: [HistoryItem]) {
        self.month = month
        self.title = title
        self.items = items
    }
}

/// A page of history.
public struct HistoryPage: Codable, Sendable, Equatable {
    public var items: [HistoryItem]
    /// Items in the whole filtered set.
    public var totalCount: Int
    public var hasMore: Bool
    /// The cursor of the next page; nil on the last.
    public var nextCursor: String?
    /// With `groupByMonth`: the page's items by month, newest first.
    public var sections: [HistorySection]?

    public init(items: [HistoryItem], totalCount: Int, hasMore: Bool, nextCursor: String?, sections: [HistorySection]? = nil) {
        self.items = items
        self.totalCount = totalCount
        self.hasMore = hasMore
        self.nextCursor = nextCursor
        self.sections = sections
    }
}

/// The answer to `delete`.
public struct DeletedHistoryItem: Codable, Sendable, Equatable {
    public var jobId: String
    public init(jobId: String) { self.jobId = jobId }
}

/// Asks for a user's changes after `token` (nil: from the beginning).
public struct ChangesSince: Codable, Sendable, Equatable {
    public var userId: String
    public var token: String?
    /// 1 to 500.
    public var limit: Int

    public init(userId: String, token: String? = nil, limit: Int = 200) {
        self.userId = userId
        self.token = token
        self.limit = limit
    }
}

/// One change of a user's history.
public struct HistoryChange: Codable, Sendable, Equatable {
    public enum Operation: String, Codable, Sendable {
        case upsert, delete
    }

    public var op: Operation
    /// The item as it is now, for `upsert`.
    public var item: HistoryItem?
    /// The deleted item's job id, for `delete`.
    public var id: String?

    public init(op: Operation, item: HistoryItem? = nil, id: String? = nil) {
        self.op = op
        self.item = item
        self.id = id
    }
}

/// A user's changes since a token, oldest first.
public struct HistoryChanges: Codable, Sendable, Equatable {
    public var changes: [HistoryChange]
    /// Pass it back to get what changes after these.
    public var nextToken: String
    /// More changes wait: ask again with `nextToken` at once.
    public var hasMore: Bool

    public init(changes: [HistoryChange], nextToken: String, hasMore: Bool) {
        self.changes = changes
        self.nextToken = nextToken
        self.hasMore = hasMore
    }
}

/// Asks for a public link to an item's result, valid for `lifetimeSeconds`.
public struct ShareItem: Codable, Sendable, Equatable {
    public var userId: String
    public var jobId: String
    public var lifetimeSeconds: Int

    public init(userId: String, jobId: String, lifetimeSeconds: Int) {
        self.userId = userId
        self.jobId = jobId
        self.lifetimeSeconds = lifetimeSeconds
    }
}

/// A public link's secret token and when it stops working.
public struct ShareGrant: Codable, Sendable, Equatable {
    public var token: String
    public var expiresAt: Date
    public init(token: String, expiresAt: Date) {
        self.token = token
        self.expiresAt = expiresAt
    }
}

/// A public link's token.
public struct ShareToken: Codable, Sendable, Equatable {
    public var token: String
    public init(token: String) { self.token = token }
}

/// What a live public link grants: the result of one completed job.
public struct SharedResult: Codable, Sendable, Equatable {
    public var jobId: String
    public var resultKey: String
    public var expiresAt: Date
    public init(jobId: String, resultKey: String, expiresAt: Date) {
        self.jobId = jobId
        self.resultKey = resultKey
        self.expiresAt = expiresAt
    }
}
