import Foundation
import GRDB
import Messages
import QuotaCore
import Storage

/// What every quota store shares: the plans, the guest limits, the calendar windows of each time
/// zone and the checks of each request; and, for SQLite, the rare writes (plans, subscription
/// events, guests) as rows, each run inside a write transaction it is given. Decisions
/// (`reserve`, `commit`, `release`) are `QuotaMemory`'s on SQLite and `PostgresQuotaStore`'s on
/// PostgreSQL.
public struct QuotaLedger: Sendable {
    public let plans: PlanCatalog
    public let guests: GuestLimits
    let windows = WindowCache()

    public init(plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits()) {
        self.plans = plans
        self.guests = guests
    }

    /// Admits a guest id: one seen before always; a new one unless its network made
    /// `guests.perNetworkHour` new guests in the last hour (then refused until the oldest of
    /// them is an hour old). With `attestedOnly`, an attested guest only.
    public func admitGuest(_ db: Database, _ request: AdmitGuest, now: Date) throws -> GuestAdmission {
        try check(request)
        let limit = guests.perNetworkHour
        let known = try Row.fetchOne(db, sql: "SELECT attestedKey FROM guest WHERE userId = ?", arguments: [request.userId])
        if request.attestedOnly == true, (known?["attestedKey"] as String?) == nil {
            return GuestAdmission(admitted: false, limit: limit, retryAt: nil, attestationRequired: true)
        }
        if known != nil { return GuestAdmission(admitted: true, limit: limit, retryAt: nil) }
        let since = now.timeIntervalSince1970 - 3600
        let recent = try Double.fetchAll(
            db, sql: "SELECT firstSeen FROM guest WHERE network = ? AND firstSeen > ? ORDER BY firstSeen LIMIT ?",
            arguments: [request.network, since, limit]
        )
        if limit > 0, recent.count >= limit {
            return GuestAdmission(admitted: false, limit: limit, retryAt: Date(timeIntervalSince1970: recent[0] + 3600))
        }
        try db.execute(sql: "INSERT INTO guest (userId, network, firstSeen) VALUES (?, ?, ?)",
                       arguments: [request.userId, request.network, now.timeIntervalSince1970])
        return GuestAdmission(admitted: true, limit: limit, retryAt: nil)
    }

    /// Binds an attested key to a guest id (creating the guest, whatever its network's count of
    /// new guests): refused when the key is another guest's. The guest's previous key, if any, is
    /// replaced.
    public func attestGuest(_ db: Database, _ request: AttestGuest, now: Date) throws -> GuestAttestation {
        try check(request)
        let owner = try String.fetchOne(db, sql: "SELECT userId FROM guest WHERE attestedKey = ?", arguments: [request.keyId])
        if let owner { return GuestAttestation(attested: owner == request.userId) }
        try db.execute(sql: """
            INSERT INTO guest (userId, network, firstSeen, attestedKey) VALUES (?, ?, ?, ?)
            ON CONFLICT (userId) DO UPDATE SET attestedKey = excluded.attestedKey
            """, arguments: [request.userId, request.network, now.timeIntervalSince1970, request.keyId])
        return GuestAttestation(attested: true)
    }

    /// Sets a user's plan and (when given) time zone; the new limits apply at once.
    public func setPlan(_ db: Database, _ request: SetPlan, now: Date) throws {
        try check(request)
        let existing = try UserRecord.fetchOne(db, key: request.userId)
        var timeZone = existing?.timeZone
        if let requested = request.timeZone { timeZone = requested.isEmpty ? nil : requested }
        try UserRecord(
            id: request.userId, plan: request.plan, timeZone: timeZone, updatedAt: now,
            planEndsAt: request.endsAt, subscriptionEventAt: existing?.subscriptionEventAt
        ).save(db)
    }

    /// Applies a subscription event once per event id, in order per user: a grant puts the user
    /// on the event's plan until its end; a revoke puts them on the default plan. An event older
    /// than the last one applied for the user is recorded and changes nothing. Answers `applied`,
    /// `stale` or `duplicate`.
    public func applySubscription(_ db: Database, _ event: SubscriptionEvent, now: Date) throws -> String {
        try check(event)
        if try Bool.fetchOne(db, sql: "SELECT 1 FROM subscription_event WHERE id = ?", arguments: [event.eventId]) != nil {
            return "duplicate"
        }
        let existing = try UserRecord.fetchOne(db, key: event.userId)
        let result: String
        if let last = existing?.subscriptionEventAt, event.occurredAt < last {
            result = "stale"
        } else {
            result = "applied"
            try UserRecord(
                id: event.userId, plan: event.effect == .grant ? event.plan : plans.defaultPlan, timeZone: existing?.timeZone,
                updatedAt: now, planEndsAt: event.effect == .grant ? event.endsAt : nil, subscriptionEventAt: event.occurredAt
            ).save(db)
        }
        try db.execute(
            sql: "INSERT INTO subscription_event (id, userId, type, occurredAt, result, receivedAt) VALUES (?, ?, ?, ?, ?, ?)",
            arguments: [event.eventId, event.userId, String(event.type.prefix(100)), event.occurredAt, result, now]
        )
        return result
    }

    /// A user's most recent charges (at most `limit`), as the tables hold them.
    public func charges(_ db: Database, user: String, limit: Int = 100) throws -> [Charge] {
        try Charge
            .filter(Charge.Columns.userId == user)
            .order(Charge.Columns.reservedAt.desc)
            .limit(limit)
            .fetchAll(db)
    }

    // MARK: Helpers

    struct UserContext {
        var userId: String
        var plan: Plan
        var planEndsAt: Date?
        var timeZone: String?
        var day: CalendarWindow
        var month: CalendarWindow
        var dailyUsed: Int
        var monthlyUsed: Int

        func status() -> QuotaStatus {
            QuotaStatus(
                userId: userId, plan: plan.name, isPro: plan.isPro, timeZone: timeZone,
                daily: QuotaRules.window(day, limit: plan.dailyLimit, used: dailyUsed),
                monthly: QuotaRules.window(month, limit: plan.monthlyLimit, used: monthlyUsed),
                retentionDays: plan.retentionDays, planEndsAt: planEndsAt
            )
        }
    }

    // MARK: Checks of requests, before any row is read (every store makes them)

    func check(_ request: ReserveQuota) throws {
        try validate(user: request.userId)
        try validate(job: request.jobId)
        guard (1...QuotaRules.maxCost).contains(request.cost) else {
            throw BusError(.badRequest, "cost must be 1 to \(QuotaRules.maxCost), not \(request.cost)")
        }
    }

    /// The guest network whose shared daily credits a reservation also draws on, if any.
    func sharedNetwork(of request: ReserveQuota) -> String? {
        guard guests.networkDaily > 0 else { return nil }
        return request.network.flatMap { $0.isEmpty || $0.utf8.count > 64 ? nil : $0 }
    }

    func check(_ request: SetPlan) throws {
        try validate(user: request.userId)
        guard plans.plan(named: request.plan) != nil else {
            throw BusError(Quota.ErrorCode.unknownPlan, "no plan named '\(request.plan)'; plans: \(plans.plans.keys.sorted().joined(separator: ", "))")
        }
        if let requested = request.timeZone, !requested.isEmpty, CalendarWindow.timeZone(requested) == nil {
            throw BusError(Quota.ErrorCode.unknownTimeZone, "'\(requested.prefix(64))' is not an IANA time zone")
        }
    }

    func check(_ event: SubscriptionEvent) throws {
        try validate(user: event.userId)
        guard QuotaRules.validId(event.eventId) else { throw BusError(.badRequest, "event id must be 1 to \(QuotaRules.maxIdLength) bytes") }
        guard event.effect == .revoke || plans.plan(named: event.plan) != nil else {
            throw BusError(Quota.ErrorCode.unknownPlan, "no plan named '\(event.plan.prefix(64))'")
        }
    }

    func check(_ request: AdjustCredits) throws {
        try validate(user: request.userId)
        try validate(job: request.chargeId)
        guard request.credits != 0, abs(request.credits) <= AdjustCredits.maxCredits else {
            throw BusError(.badRequest, "credits must be 1 to \(AdjustCredits.maxCredits) either way, not \(request.credits)")
        }
    }

    func check(_ request: AdmitGuest) throws {
        try validate(user: request.userId)
        try validate(network: request.network)
    }

    func check(_ request: AttestGuest) throws {
        try validate(user: request.userId)
        try validate(network: request.network)
        guard (1...64).contains(request.keyId.utf8.count) else { throw BusError(.badRequest, "keyId must be 1 to 64 bytes") }
    }

    private func validate(network: String) throws {
        guard (1...64).contains(network.utf8.count) else { throw BusError(.badRequest, "network must be 1 to 64 bytes") }
    }

    func validate(user: String) throws {
        guard QuotaRules.validId(user) else {
            throw BusError(.badRequest, "user id must be 1 to \(QuotaRules.maxIdLength) bytes without control characters")
        }
    }

    func validate(job: String) throws {
        guard QuotaRules.validId(job) else {
            throw BusError(.badRequest, "job id must be 1 to \(QuotaRules.maxIdLength) bytes without control characters")
        }
    }
}
