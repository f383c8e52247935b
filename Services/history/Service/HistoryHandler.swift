import Bus
import Crypto
import Foundation
import Messages
import Metrics
import ServiceKit

/// The history service's bus methods.
public struct HistoryHandler: Sendable {
    let database: any HistoryStore
    let purges: any OutboxWaker
    let now: @Sendable () -> Date

    public init(store: any HistoryStore, purges: any OutboxWaker, now: @escaping @Sendable () -> Date = Date.init) {
        self.database = store
        self.purges = purges
        self.now = now
    }

    static let received = Counter(label: "history_events_received_total")
    static let applied = Counter(label: "history_events_applied_total")
    static let lag = Metrics.Timer(label: "history_event_lag_seconds")

    /// `history_events_received_total`, `history_events_applied_total` (those that changed an
    /// item) and `history_event_lag_seconds`: from the job change an event carries to now.
    static func count(_ events: [JobEvent], applied: Int, now: Date) {
        Self.received.increment(by: events.count)
        Self.applied.increment(by: applied)
        let lag = Self.lag
        for event in events {
            lag.recordSeconds(max(0, now.timeIntervalSince(event.job.updatedAt)))
        }
    }

    /// Registers every history method on `router`, and makes its metrics' series at zero.
    public func register(on router: inout BusRouter) {
        _ = (Self.received, Self.applied, Self.lag)
        router.register(History.apply) { request, _ in
            guard request.events.count <= 1000 else { throw BusError(.badRequest, "at most 1,000 events a batch") }
            let applied = try await database.applyJobEvents(request.events)
            Self.count(request.events, applied: applied, now: Date())
            return EventsApplied(applied: applied)
        }
        router.register(History.list) { request, _ in
            try Self.validate(request)
            return try await database.page(request)
        }
        router.register(History.page) { request, _ in
            try Self.validate(request)
            return try await database.renderedPage(request)
        }
        router.register(History.get) { request, _ in
            guard let item = try await database.item(request.jobId, userId: request.userId) else { throw Self.notFound(request.jobId) }
            return item
        }
        router.register(History.delete) { request, _ in
            guard let deleted = try await database.deleteItem(request.jobId, userId: request.userId, now: now()) else {
                throw Self.notFound(request.jobId)
            }
            purges.wake()
            return deleted
        }
        router.register(History.changes) { request, _ in
            guard (1...500).contains(request.limit) else { throw BusError(.badRequest, "limit must be 1 to 500") }
            return try await database.changes(request)
        }
        router.register(History.share) { request, _ in
            guard (1...(365 * 86_400)).contains(request.lifetimeSeconds) else {
                throw BusError(.badRequest, "a share link lives 1 second to 365 days")
            }
            let expiresAt = now().addingTimeInterval(Double(request.lifetimeSeconds))
            guard let grant = try await database.shareItem(request.jobId, userId: request.userId, token: Self.newToken(), expiresAt: expiresAt) else {
                throw Self.notFound(request.jobId)
            }
            return grant
        }
        router.register(History.unshare) { request, _ in
            guard try await database.revokeShares(request.jobId, userId: request.userId) else { throw Self.notFound(request.jobId) }
            return Empty()
        }
        router.register(History.openShare) { request, _ in
            guard request.token.utf8.count <= 128, let shared = try await database.sharedResult(token: request.token, now: now()) else {
                throw BusError(.notFound, "no such share link, or it was revoked or has expired")
            }
            return shared
        }
    }

    static func validate(_ request: ListHistory) throws {
        guard (1...100).contains(request.limit) else { throw BusError(.badRequest, "limit must be 1 to 100") }
        guard request.offset >= 0, request.offset <= 1_000_000 else { throw BusError(.badRequest, "offset must be 0 to 1,000,000") }
        if let query = request.query, query.utf8.count > 200 { throw BusError(.badRequest, "q must be at most 200 bytes") }
    }

    static func notFound(_ jobId: String) -> BusError {
        BusError(.notFound, "no history item \(jobId.prefix(64))")
    }

    /// 32 random bytes, base64url: the secret part of a share link.
    static func newToken() -> String {
        let key = SymmetricKey(size: .bits256)
        return key.withUnsafeBytes { Base64URL.encode(Data($0)) }
    }
}
