import Foundation
import GRDB
import Messages
import QuotaCore
import Storage

/// The quota operations, each run inside a write transaction it is given: what `reserve`,
/// `commit`, `release` and the rest mean in rows.
public struct QuotaLedger: Sendable {
    public let plans: PlanCatalog
    public let guests: GuestLimits
    let windows = WindowCache()

    public init(plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits()) {
        self.plans = plans
        self.guests = guests
    }

    /// Charges `request.cost` against both windows, or denies naming the windows that refuse.
    /// A job id already charged returns its admission again and charges nothing more.
    public func reserve(_ db: Database, _ request: ReserveQuota, now: Date) throws -> QuotaDecision {
        try check(request)
        let existing = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT userId, state FROM charge WHERE jobId = ?"), arguments: [request.jobId]
        )
        if let existing {
            guard existing["userId"] as String == request.userId else {
                throw BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user")
            }
            // Reserved or committed: the same admission again. Released (its job was never made,
            // or ended without a result): a retry of it is charged afresh, below.
            if existing["state"] as String != "released" {
                return QuotaDecision(admitted: true, jobId: request.jobId, status: try status(db, user: request.userId, now: now), violated: [], retryAt: nil)
            }
            try db.execute(sql: "DELETE FROM charge WHERE jobId = ?", arguments: [request.jobId])
        }
        let context = try userContext(db, request.userId, now: now)
        let verdict = QuotaRules.decide(
            plan: context.plan, cost: request.cost,
            dailyUsed: context.dailyUsed, monthlyUsed: context.monthlyUsed,
            day: context.day, month: context.month
        )
        guard verdict.admitted else {
            return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: verdict.violated, retryAt: verdict.retryAt)
        }
        // A guest's network shares the day's free credits of all its guests (UTC days), except
        // with an attested guest: a real install of the app, however many share its address.
        var network = sharedNetwork(of: request)
        if network != nil, try isAttested(db, request.userId) { network = nil }
        if let network {
            let used = try Int.fetchOne(
                db.cachedStatement(sql: "SELECT used FROM usage WHERE userId = ? AND window = 'daily' AND windowKey = ?"),
                arguments: ["net:" + network, context.day.key]
            ) ?? 0
            if used + request.cost > guests.networkDaily {
                return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: ["network"],
                                     retryAt: context.day.end, networkRemaining: max(0, guests.networkDaily - used))
            }
        }
        let charge = try db.cachedStatement(sql: """
            INSERT INTO usage (userId, window, windowKey, used) VALUES (?, ?, ?, ?)
            ON CONFLICT (userId, window, windowKey) DO UPDATE SET used = used + excluded.used
            """)
        for window in [context.day, context.month] {
            try charge.execute(arguments: [request.userId, window.kind.rawValue, window.key, request.cost])
        }
        if let network { try charge.execute(arguments: ["net:" + network, CalendarWindow.Kind.daily.rawValue, context.day.key, request.cost]) }
        try db.cachedStatement(sql: """
            INSERT INTO charge (jobId, userId, cost, state, dayKey, monthKey, reservedAt, network)
            VALUES (?, ?, ?, 'reserved', ?, ?, ?, ?)
            """).execute(arguments: [request.jobId, request.userId, request.cost, context.day.key, context.month.key, StoredDate.text(now), network])
        var charged = context
        charged.dailyUsed += request.cost
        charged.monthlyUsed += request.cost
        return QuotaDecision(admitted: true, jobId: request.jobId, status: charged.status(), violated: [], retryAt: nil)
    }

    /// Marks a reservation committed: the job completed. Committing twice is harmless; committing
    /// a released charge is refused and changes nothing.
    public func commit(_ db: Database, jobId: String, now: Date) throws -> Charge {
        var charge = try existingCharge(db, jobId)
        switch charge.state {
        case .committed: return charge
        case .released: throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was released; it cannot be committed")
        case .reserved:
            charge.state = .committed
            charge.settledAt = now
            try charge.update(db)
            return charge
        }
    }

    /// Gives a reservation's units back to the windows it was charged in (not the current ones).
    /// Releasing twice gives back once; releasing a committed charge is refused.
    public func release(_ db: Database, jobId: String, now: Date) throws -> Charge {
        var charge = try existingCharge(db, jobId)
        switch charge.state {
        case .released: return charge
        case .committed: throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was committed; it cannot be released")
        case .reserved:
            for (window, key) in [(CalendarWindow.Kind.daily, charge.dayKey), (.monthly, charge.monthKey)] {
                try db.execute(
                    sql: "UPDATE usage SET used = max(0, used - ?) WHERE userId = ? AND window = ? AND windowKey = ?",
                    arguments: [charge.cost, charge.userId, window.rawValue, key]
                )
            }
            if let network = try String.fetchOne(db, sql: "SELECT network FROM charge WHERE jobId = ?", arguments: [jobId]) {
                try db.execute(
                    sql: "UPDATE usage SET used = max(0, used - ?) WHERE userId = ? AND window = 'daily' AND windowKey = ?",
                    arguments: [charge.cost, "net:" + network, charge.dayKey]
                )
            }
            charge.state = .released
            charge.settledAt = now
            try charge.update(db)
            return charge
        }
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

    /// Whether a user is a guest whose device was attested.
    func isAttested(_ db: Database, _ userId: String) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT attestedKey IS NOT NULL FROM guest WHERE userId = ?"), arguments: [userId]
        ) ?? false
    }

    /// The user's plan and windows now.
    public func status(_ db: Database, user: String, now: Date) throws -> QuotaStatus {
        try validate(user: user)
        return try userContext(db, user, now: now).status()
    }

    /// Sets a user's plan and (when given) time zone; the new limits apply at once.
    public func setPlan(_ db: Database, _ request: SetPlan, now: Date) throws -> QuotaStatus {
        try check(request)
        let existing = try UserRecord.fetchOne(db, key: request.userId)
        var timeZone = existing?.timeZone
        if let requested = request.timeZone { timeZone = requested.isEmpty ? nil : requested }
        try UserRecord(
            id: request.userId, plan: request.plan, timeZone: timeZone, updatedAt: now,
            planEndsAt: request.endsAt, subscriptionEventAt: existing?.subscriptionEventAt
        ).save(db)
        return try userContext(db, request.userId, now: now).status()
    }

    /// Applies a subscription event once per event id, in order per user: a grant puts the user
    /// on the event's plan until its end; a revoke puts them on the default plan. An event older
    /// than the last one applied for the user is recorded and changes nothing.
    public func applySubscription(_ db: Database, _ event: SubscriptionEvent, now: Date) throws -> SubscriptionOutcome {
        try check(event)
        if try Bool.fetchOne(db, sql: "SELECT 1 FROM subscription_event WHERE id = ?", arguments: [event.eventId]) != nil {
            return SubscriptionOutcome(result: "duplicate", status: try status(db, user: event.userId, now: now))
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
        return SubscriptionOutcome(result: result, status: try status(db, user: event.userId, now: now))
    }

    /// The user's status and their most recent charges (at most `limit`).
    public func usage(_ db: Database, user: String, now: Date, limit: Int = 100) throws -> UserUsage {
        let status = try status(db, user: user, now: now)
        let charges = try Charge
            .filter(Charge.Columns.userId == user)
            .order(Charge.Columns.reservedAt.desc)
            .limit(limit)
            .fetchAll(db)
        return UserUsage(status: status, charges: charges)
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

    func userContext(_ db: Database, _ userId: String, now: Date) throws -> UserContext {
        let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT plan, timeZone, planEndsAt FROM user WHERE id = ?"), arguments: [userId])
        let timeZone: String? = row?["timeZone"]
        // A plan with an end is the default plan from that instant on, whether or not anyone
        // said so: an expiry event that never comes changes nothing.
        var planName: String? = row?["plan"]
        var planEndsAt: Date? = row?["planEndsAt"]
        if let end = planEndsAt, now >= end {
            planName = nil
            planEndsAt = nil
        }
        let (day, month) = windows.windows(containing: now, timeZone: timeZone)
        let usage = try db.cachedStatement(sql: "SELECT used FROM usage WHERE userId = ? AND window = ? AND windowKey = ?")
        func used(_ window: CalendarWindow) throws -> Int {
            try Int.fetchOne(usage, arguments: [userId, window.kind.rawValue, window.key]) ?? 0
        }
        return UserContext(
            userId: userId, plan: plans.effectivePlan(planName), planEndsAt: planEndsAt, timeZone: timeZone,
            day: day, month: month, dailyUsed: try used(day), monthlyUsed: try used(month)
        )
    }

    private func existingCharge(_ db: Database, _ jobId: String) throws -> Charge {
        try validate(job: jobId)
        guard let charge = try Charge.fetchOne(db, key: jobId) else {
            throw BusError(.notFound, "no charge for job \(jobId)")
        }
        return charge
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
