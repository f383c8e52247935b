import Foundation
import Messages
import ServiceKit

/// What the history service stores, as the operations its bus methods and its retention sweep
/// need: each write one transaction, named for its intent. `HistoryHandler` and
/// `RetentionSweeper` depend on this. `HistoryDatabase` (SQLite, FTS5 trigram search) is the
/// embedded one; `PostgresHistoryStore` (`HISTORY_DATABASE_URL`, pg_trgm search) serves any
/// number of history replicas over one database.
public protocol HistoryStore: Sendable {
    /// Applies job events idempotently by (job id, version); returns how many changed an item.
    func applyJobEvents(_ events: [JobEvent]) async throws -> Int
    /// One page of a user's items (filtered, searched, optionally in month sections).
    func page(_ request: ListHistory) async throws -> HistoryPage
    /// The same page with each item's JSON written up to its URLs (`history.page`).
    func renderedPage(_ request: ListHistory) async throws -> RenderedHistoryPage
    /// One of the user's items; nil for anyone else's or none.
    func item(_ jobId: String, userId: String) async throws -> HistoryItem?
    /// Deletes one of the user's items, leaving a tombstone and queueing its purge for jobs.
    func deleteItem(_ jobId: String, userId: String, now: Date) async throws -> DeletedHistoryItem?
    /// What changed for a user since a token (the offline cache's feed).
    func changes(_ request: ChangesSince) async throws -> HistoryChanges
    /// A share link for one of the user's ended items; nil if not theirs.
    func shareItem(_ jobId: String, userId: String, token: String, expiresAt: Date) async throws -> ShareGrant?
    /// Revokes an item's share links; false if not theirs.
    func revokeShares(_ jobId: String, userId: String) async throws -> Bool
    /// What a live share token opens.
    func sharedResult(token: String, now: Date) async throws -> SharedResult?
    /// Users with items created before a date, a batch after `afterUser`.
    func usersWithItems(before: Date, afterUser: String, limit: Int) async throws -> (users: [String], scannedThrough: String?)
    /// Deletes up to `limit` of a user's ended items created before `cutoff`.
    func deleteExpiredItems(userId: String, before cutoff: Date, limit: Int, now: Date) async throws -> Int
    /// Forgets tombstones (and expired shares) older than the changes feed keeps.
    func pruneTombstones(before: Date, now: Date, limit: Int) async throws -> Int
    /// Purges not yet acknowledged by jobs.
    func pendingPurgeCount() async throws -> Int
    /// Purges due at `now`, oldest first.
    func duePurges(now: Date, limit: Int) async throws -> [OutboxItem<PendingPurge>]
    /// Jobs acknowledged the purges: they leave the outbox.
    func purgesAcknowledged(_ jobIds: [String]) async throws
    /// The purge failed: try again at `retryAt`.
    /// Purges jobs did not acknowledge (ids are job ids): each tried again at its `at`.
    func purgesFailed(_ entries: [OutboxRetry]) async throws
}

extension HistoryStore {
    /// The purge outbox, as its relay reads it.
    public var purges: PurgeOutbox { PurgeOutbox(store: self) }
}

extension HistoryDatabase: HistoryStore {}

/// A job whose purge jobs has not acknowledged yet.
public struct PendingPurge: Sendable, Equatable {
    public var jobId: String
    public var userId: String
}

/// History's outbox of purges: a deleted item's job, to be purged by jobs (its files and row).
/// With replicas every replica's relay reads it: a purge may be delivered twice, which jobs'
/// purge (idempotent by job id) makes harmless.
public struct PurgeOutbox: Outbox {
    let store: any HistoryStore

    public func due(now: Date, limit: Int) async throws -> [OutboxItem<PendingPurge>] { try await store.duePurges(now: now, limit: limit) }
    public func acknowledge(_ ids: [String]) async throws { try await store.purgesAcknowledged(ids) }
    public func retry(_ entries: [OutboxRetry]) async throws { try await store.purgesFailed(entries) }
}
