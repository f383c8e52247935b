import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
import Storage

/// The quota service's store on PostgreSQL (`QUOTA_DATABASE_URL`), for any number of quota
/// replicas over one database. The same operations as `QuotaDatabase`, in the same rules
/// (`QuotaRules`, `QuotaLedger`'s plans, windows and checks); what differs is how concurrent
/// replicas stay exact:
/// - a user's reservations, plan changes and subscription events run one at a time, whichever
///   replica receives them: each takes a transaction-scoped advisory lock on the user
///   (`pg_advisory_xact_lock`), so admission reads the windows no other transaction is changing;
///   a guest network's shared credits and new-guest count are locked the same way;
/// - a job id is charged once: the charge's primary key; a second reservation of it by the same
///   user (serialised by the lock) answers the first admission again;
/// - a decision is durable before its answer: the transaction commits (`synchronous_commit` on)
///   before the reply is sent.
public struct PostgresQuotaStore: QuotaStore {
    let database: PostgresPool
    let ledger: QuotaLedger
    let logger: Logger

    public init(database: PostgresPool, plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits(), logger: Logger) {
        self.database = database
        self.ledger = QuotaLedger(plans: plans, guests: guests)
        self.logger = logger
    }

    /// Creates or updates the quota tables (once, however many replicas start together).
    public func migrate() async throws {
        try await database.migrate(service: "quota", Self.migrations)
    }

    public static let migrations = [
        PostgresMigration("v1: users, usage, charges, subscription events, guests", [
            """
            CREATE TABLE quota_user (
                id text PRIMARY KEY, plan text NOT NULL, time_zone text, updated_at timestamptz NOT NULL,
                plan_ends_at timestamptz, subscription_event_at timestamptz)
            """,
            """
            CREATE TABLE quota_usage (
                user_id text NOT NULL, window_kind text NOT NULL, window_key text NOT NULL, used integer NOT NULL,
                PRIMARY KEY (user_id, window_kind, window_key))
            """,
            """
            CREATE TABLE quota_charge (
                job_id text PRIMARY KEY, user_id text NOT NULL, cost integer NOT NULL, state text NOT NULL,
                day_key text NOT NULL, month_key text NOT NULL, reserved_at timestamptz NOT NULL, settled_at timestamptz,
                network text)
            """,
            "CREATE INDEX quota_charge_by_user ON quota_charge (user_id, reserved_at)",
            "CREATE INDEX quota_charge_by_state ON quota_charge (state, reserved_at)",
            """
            CREATE TABLE quota_subscription_event (
                id text PRIMARY KEY, user_id text NOT NULL, type text NOT NULL, occurred_at timestamptz NOT NULL,
                result text NOT NULL, received_at timestamptz NOT NULL)
            """,
            """
            CREATE TABLE quota_guest (
                user_id text PRIMARY KEY, network text NOT NULL, first_seen double precision NOT NULL, attested_key text)
            """,
            "CREATE INDEX quota_guest_by_network ON quota_guest (network, first_seen)",
            "CREATE UNIQUE INDEX quota_guest_by_attested_key ON quota_guest (attested_key) WHERE attested_key IS NOT NULL",
        ]),
    ]

    // MARK: QuotaStore

    public func reserve(_ request: ReserveQuota, now: Date) async throws -> QuotaDecision {
        try ledger.check(request)
        let network = ledger.sharedNetwork(of: request)
        let (ledger, logger) = (ledger, logger)
        do {
            return try await database.transaction { db in
                try await Self.lock(db, "user:" + request.userId, logger: logger)
                if let (owner, state) = try await db.firstRow(
                    "SELECT user_id, state FROM quota_charge WHERE job_id = \(request.jobId)", as: (String, String).self, logger: logger
                ) {
                    guard owner == request.userId else {
                        throw BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user")
                    }
                    // Reserved or committed: the same admission again. Released (its job was never
                    // made, or ended without a result): a retry of it is charged afresh, below.
                    if state != "released" {
                        let context = try await Self.userContext(db, ledger, request.userId, now: now, logger: logger)
                        return QuotaDecision(admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil)
                    }
                    try await db.query("DELETE FROM quota_charge WHERE job_id = \(request.jobId)", logger: logger)
                }
                let context = try await Self.userContext(db, ledger, request.userId, now: now, logger: logger)
                let verdict = QuotaRules.decide(
                    plan: context.plan, cost: request.cost, dailyUsed: context.dailyUsed, monthlyUsed: context.monthlyUsed,
                    day: context.day, month: context.month
                )
                guard verdict.admitted else {
                    return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: verdict.violated, retryAt: verdict.retryAt)
                }
                // A guest's network shares the day's free credits of its guests (UTC days), except
                // with an attested guest.
                var shared = network
                if shared != nil,
                   try await db.first("SELECT attested_key IS NOT NULL FROM quota_guest WHERE user_id = \(request.userId)", as: Bool.self, logger: logger) == true {
                    shared = nil
                }
                if let shared {
                    try await Self.lock(db, "network:" + shared, logger: logger)
                    let used = try await db.first(
                        "SELECT used FROM quota_usage WHERE user_id = \("net:" + shared) AND window_kind = 'daily' AND window_key = \(context.day.key)",
                        as: Int.self, logger: logger
                    ) ?? 0
                    if used + request.cost > ledger.guests.networkDaily {
                        return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: ["network"],
                                             retryAt: context.day.end, networkRemaining: max(0, ledger.guests.networkDaily - used))
                    }
                }
                var charged: [(String, CalendarWindow)] = [(request.userId, context.day), (request.userId, context.month)]
                if let shared { charged.append(("net:" + shared, context.day)) }
                for (user, window) in charged {
                    try await db.query("""
                        INSERT INTO quota_usage (user_id, window_kind, window_key, used) VALUES (\(user), \(window.kind.rawValue), \(window.key), \(request.cost))
                        ON CONFLICT (user_id, window_kind, window_key) DO UPDATE SET used = quota_usage.used + excluded.used
                        """, logger: logger)
                }
                try await db.query("""
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at, network)
                    VALUES (\(request.jobId), \(request.userId), \(request.cost), 'reserved', \(context.day.key), \(context.month.key), \(now), \(shared))
                    """, logger: logger)
                var after = context
                after.dailyUsed += request.cost
                after.monthlyUsed += request.cost
                return QuotaDecision(admitted: true, jobId: request.jobId, status: after.status(), violated: [], retryAt: nil)
            }
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == "23505" {
            // Another user's reservation took the job id in between.
            throw BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user")
        }
    }

    public func commit(jobId: String, now: Date) async throws -> Charge {
        try await settle(jobId: jobId, now: now, to: .committed)
    }

    public func release(jobId: String, now: Date) async throws -> Charge {
        try await settle(jobId: jobId, now: now, to: .released)
    }

    /// Commits or releases a reservation; settling it the same way twice is harmless, the other
    /// way refused. A release gives the charge back to the windows it was taken from.
    private func settle(jobId: String, now: Date, to state: Charge.State) async throws -> Charge {
        try ledger.validate(job: jobId)
        let logger = logger
        return try await database.transaction { db in
            guard let row = try await db.firstRow(
                "SELECT \(unescaped: Self.chargeColumns), network FROM quota_charge WHERE job_id = \(jobId) FOR UPDATE",
                as: ChargeRow.self, logger: logger
            ) else {
                throw BusError(.notFound, "no charge for job \(jobId)")
            }
            var (charge, network) = Self.charge(row)
            switch (charge.state, state) {
            case (.committed, .committed), (.released, .released):
                return charge
            case (.released, _):
                throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was released; it cannot be committed")
            case (.committed, _):
                throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was committed; it cannot be released")
            case (.reserved, _):
                break
            }
            if state == .released {
                var windows = [(charge.userId, "daily", charge.dayKey), (charge.userId, "monthly", charge.monthKey)]
                if let network { windows.append(("net:" + network, "daily", charge.dayKey)) }
                for (user, kind, key) in windows {
                    try await db.query("""
                        UPDATE quota_usage SET used = greatest(0, used - \(charge.cost))
                        WHERE user_id = \(user) AND window_kind = \(kind) AND window_key = \(key)
                        """, logger: logger)
                }
            }
            try await db.query(
                "UPDATE quota_charge SET state = \(state.rawValue), settled_at = \(now) WHERE job_id = \(jobId)", logger: logger
            )
            charge.state = state
            charge.settledAt = now
            return charge
        }
    }

    public func status(userId: String, now: Date) async throws -> QuotaStatus {
        try ledger.validate(user: userId)
        let (ledger, logger) = (ledger, logger)
        return try await database.connection { db in
            try await Self.userContext(db, ledger, userId, now: now, logger: logger).status()
        }
    }

    public func setPlan(_ request: SetPlan, now: Date) async throws -> QuotaStatus {
        try ledger.check(request)
        let (ledger, logger) = (ledger, logger)
        return try await database.transaction { db in
            try await Self.lock(db, "user:" + request.userId, logger: logger)
            // nil keeps the zone; "" clears it.
            let keepZone = request.timeZone == nil
            let zone = request.timeZone.flatMap { $0.isEmpty ? nil : $0 }
            try await db.query("""
                INSERT INTO quota_user (id, plan, time_zone, updated_at, plan_ends_at) VALUES (\(request.userId), \(request.plan), \(zone), \(now), \(request.endsAt))
                ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, updated_at = excluded.updated_at, plan_ends_at = excluded.plan_ends_at,
                    time_zone = CASE WHEN \(keepZone) THEN quota_user.time_zone ELSE excluded.time_zone END
                """, logger: logger)
            return try await Self.userContext(db, ledger, request.userId, now: now, logger: logger).status()
        }
    }

    public func applySubscription(_ event: SubscriptionEvent, now: Date) async throws -> SubscriptionOutcome {
        try ledger.check(event)
        let (ledger, logger) = (ledger, logger)
        return try await database.transaction { db in
            try await Self.lock(db, "user:" + event.userId, logger: logger)
            if try await db.first("SELECT 1 FROM quota_subscription_event WHERE id = \(event.eventId)", as: Int32.self, logger: logger) != nil {
                return SubscriptionOutcome(result: "duplicate", status: try await Self.userContext(db, ledger, event.userId, now: now, logger: logger).status())
            }
            let last = try await db.first(
                "SELECT subscription_event_at FROM quota_user WHERE id = \(event.userId)", as: Date?.self, logger: logger
            ) ?? nil
            let result: String
            if let last, event.occurredAt < last {
                result = "stale"
            } else {
                result = "applied"
                let plan = event.effect == .grant ? event.plan : ledger.plans.defaultPlan
                let endsAt = event.effect == .grant ? event.endsAt : nil
                try await db.query("""
                    INSERT INTO quota_user (id, plan, updated_at, plan_ends_at, subscription_event_at)
                    VALUES (\(event.userId), \(plan), \(now), \(endsAt), \(event.occurredAt))
                    ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, updated_at = excluded.updated_at,
                        plan_ends_at = excluded.plan_ends_at, subscription_event_at = excluded.subscription_event_at
                    """, logger: logger)
            }
            try await db.query("""
                INSERT INTO quota_subscription_event (id, user_id, type, occurred_at, result, received_at)
                VALUES (\(event.eventId), \(event.userId), \(String(event.type.prefix(100))), \(event.occurredAt), \(result), \(now))
                """, logger: logger)
            return SubscriptionOutcome(result: result, status: try await Self.userContext(db, ledger, event.userId, now: now, logger: logger).status())
        }
    }

    public func admitGuest(_ request: AdmitGuest, now: Date) async throws -> GuestAdmission {
        try ledger.check(request)
        let limit = ledger.guests.perNetworkHour
        let logger = logger
        return try await database.transaction { db in
            try await Self.lock(db, "network:" + request.network, logger: logger)
            let known = try await db.first(
                "SELECT attested_key FROM quota_guest WHERE user_id = \(request.userId)", as: String?.self, logger: logger
            )
            if request.attestedOnly == true, (known ?? nil) == nil {
                return GuestAdmission(admitted: false, limit: limit, retryAt: nil, attestationRequired: true)
            }
            if known != nil { return GuestAdmission(admitted: true, limit: limit, retryAt: nil) }
            let since = now.timeIntervalSince1970 - 3600
            let recent = try await db.all(
                "SELECT first_seen FROM quota_guest WHERE network = \(request.network) AND first_seen > \(since) ORDER BY first_seen LIMIT \(limit)",
                as: Double.self, logger: logger
            )
            if limit > 0, recent.count >= limit {
                return GuestAdmission(admitted: false, limit: limit, retryAt: Date(timeIntervalSince1970: recent[0] + 3600))
            }
            try await db.query("""
                INSERT INTO quota_guest (user_id, network, first_seen) VALUES (\(request.userId), \(request.network), \(now.timeIntervalSince1970))
                ON CONFLICT (user_id) DO NOTHING
                """, logger: logger)
            return GuestAdmission(admitted: true, limit: limit, retryAt: nil)
        }
    }

    public func attestGuest(_ request: AttestGuest, now: Date) async throws -> GuestAttestation {
        try ledger.check(request)
        let logger = logger
        return try await database.transaction { db in
            try await Self.lock(db, "attested-key:" + request.keyId, logger: logger)
            if let owner = try await db.first("SELECT user_id FROM quota_guest WHERE attested_key = \(request.keyId)", as: String.self, logger: logger) {
                return GuestAttestation(attested: owner == request.userId)
            }
            try await db.query("""
                INSERT INTO quota_guest (user_id, network, first_seen, attested_key) VALUES (\(request.userId), \(request.network), \(now.timeIntervalSince1970), \(request.keyId))
                ON CONFLICT (user_id) DO UPDATE SET attested_key = excluded.attested_key
                """, logger: logger)
            return GuestAttestation(attested: true)
        }
    }

    public func usage(userId: String, now: Date) async throws -> UserUsage {
        try ledger.validate(user: userId)
        let (ledger, logger) = (ledger, logger)
        return try await database.connection { db in
            let status = try await Self.userContext(db, ledger, userId, now: now, logger: logger).status()
            let rows = try await db.allRows(
                "SELECT \(unescaped: Self.chargeColumns), network FROM quota_charge WHERE user_id = \(userId) ORDER BY reserved_at DESC LIMIT 100",
                as: ChargeRow.self, logger: logger
            )
            return UserUsage(status: status, charges: rows.map { Self.charge($0).charge })
        }
    }

    public func staleReservations(before cutoff: Date, limit: Int) async throws -> [String] {
        let logger = logger
        return try await database.connection { db in
            try await db.all(
                "SELECT job_id FROM quota_charge WHERE state = 'reserved' AND reserved_at < \(cutoff) ORDER BY reserved_at LIMIT \(limit)",
                as: String.self, logger: logger
            )
        }
    }

    // MARK: Rows

    typealias ChargeRow = (String, String, Int, String, String, String, Date, Date?, String?)
    static let chargeColumns: String = "job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at"

    static func charge(_ row: ChargeRow) -> (charge: Charge, network: String?) {
        (Charge(jobId: row.0, userId: row.1, cost: row.2, state: Charge.State(rawValue: row.3) ?? .reserved,
                dayKey: row.4, monthKey: row.5, reservedAt: row.6, settledAt: row.7), row.8)
    }

    /// Holds `key` (a user, a network) until the transaction ends.
    static func lock(_ db: PostgresConnection, _ key: String, logger: Logger) async throws {
        try await db.query("SELECT pg_advisory_xact_lock(hashtext(\("quota:" + key)))", logger: logger)
    }

    /// The user's plan (the default from its end on), zone, windows now and what they used.
    static func userContext(_ db: PostgresConnection, _ ledger: QuotaLedger, _ userId: String, now: Date, logger: Logger) async throws -> QuotaLedger.UserContext {
        let row = try await db.firstRow(
            "SELECT plan, time_zone, plan_ends_at FROM quota_user WHERE id = \(userId)", as: (String, String?, Date?).self, logger: logger
        )
        var planName = row?.0
        var planEndsAt = row?.2 ?? nil
        if let end = planEndsAt, now >= end {
            planName = nil
            planEndsAt = nil
        }
        let timeZone = row?.1 ?? nil
        let (day, month) = ledger.windows.windows(containing: now, timeZone: timeZone)
        var used: [String: Int] = [:]
        for try await (kind, value) in try await db.query("""
            SELECT window_kind, used FROM quota_usage WHERE user_id = \(userId)
            AND ((window_kind = 'daily' AND window_key = \(day.key)) OR (window_kind = 'monthly' AND window_key = \(month.key)))
            """, logger: logger).decode((String, Int).self) {
            used[kind] = value
        }
        return QuotaLedger.UserContext(
            userId: userId, plan: ledger.plans.effectivePlan(planName), planEndsAt: planEndsAt, timeZone: timeZone,
            day: day, month: month, dailyUsed: used["daily"] ?? 0, monthlyUsed: used["monthly"] ?? 0
        )
    }
}
