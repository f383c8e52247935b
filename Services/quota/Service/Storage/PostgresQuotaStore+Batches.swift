import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
import Storage

/// Reservations, commits and releases decided in batches (`PostgresBatcher`): one transaction per
/// batch, and a fixed number of statements in it whatever its size:
///
/// 1. the advisory locks of the batch's users and guest networks, taken in one fixed order (by
///    their hash), so two replicas' batches never wait for each other in a circle;
/// 2. the charges of its job ids, locked in job id order (`FOR UPDATE`): a commit or release
///    holds its charge, and a reservation learns whether its job id is already charged;
/// 3. the users' rows, 4. their windows' usage, 5. (with guests) which guests are attested;
/// 6. every charge made or settled, as one ordered upsert; 7. every window's change, as one.
///
/// Between 5 and 6 the batch is decided in order, by the same rules as one decision at a time
/// (`QuotaRules`): a later operation sees what an earlier one in the batch did. Rows are locked in
/// the same order by every batch (advisory locks, then charges, then usage, each sorted), which is
/// why batches on two replicas do not deadlock; were PostgreSQL to report one anyway, or a job id
/// taken by another user's batch in between, the batch is run again from the start.
extension PostgresQuotaStore {
    /// One operation of a batch, checked already (`QuotaLedger.check`).
    enum Operation: Sendable {
        case reserve(ReserveQuota, now: Date)
        case settle(jobId: String, to: Charge.State, now: Date)

        var jobId: String {
            switch self {
            case .reserve(let request, _): request.jobId
            case .settle(let jobId, _, _): jobId
            }
        }
    }

    enum Outcome: Sendable {
        case decision(QuotaDecision)
        case charge(Charge)
    }

    /// How many times a batch is run again after a deadlock or a job id taken in between.
    static let batchAttempts = 3

    /// Decides `batch` in one transaction (see the extension's notes).
    static func decide(_ batch: [Operation], database: PostgresPool, ledger: QuotaLedger, logger: Logger) async throws -> [Result<Outcome, any Error>] {
        var attempt = 1
        while true {
            do {
                return try await database.transaction { db in
                    try await decide(batch, db, ledger: ledger, logger: logger)
                }
            } catch let error as PSQLError where attempt < batchAttempts && ["40P01", "40001", "23505"].contains(error.serverInfo?[.sqlState] ?? "") {
                logger.debug("quota batch run again", metadata: ["sqlState": "\(error.serverInfo?[.sqlState] ?? "")"])
            } catch is JobIdTakenMeanwhile where attempt < batchAttempts {
                logger.debug("quota batch run again: a job id was charged by another batch meanwhile")
            }
            attempt += 1
        }
    }

    /// Another transaction charged one of the batch's new job ids after the batch read them.
    struct JobIdTakenMeanwhile: Error, CustomStringConvertible {
        var description: String { "a job id was charged by another user's reservation at the same time; try again" }
    }

    /// A window's usage row.
    struct UsageKey: Hashable {
        var owner: String
        var kind: String
        var key: String
    }

    private static func decide(_ batch: [Operation], _ db: PostgresConnection, ledger: QuotaLedger, logger: Logger) async throws -> [Result<Outcome, any Error>] {
        var reserving: Set<String> = []
        var networks: Set<String> = []
        for operation in batch {
            guard case .reserve(let request, _) = operation else { continue }
            reserving.insert(request.userId)
            if let network = ledger.sharedNetwork(of: request) { networks.insert(network) }
        }

        // 1. Locks, in one order.
        try await db.lockInHashOrder(reserving.map { "quota:user:" + $0 } + networks.map { "quota:network:" + $0 }, logger: logger)

        // 2. The charges.
        var charges: [String: (charge: Charge, network: String?)] = [:]
        let jobIds = Array(Set(batch.map(\.jobId)))
        for row in try await db.allRows(
            "SELECT \(unescaped: chargeColumns), network FROM quota_charge WHERE job_id = ANY(\(jobIds)::text[]) ORDER BY job_id FOR UPDATE",
            as: ChargeRow.self, logger: logger
        ) {
            let (charge, network) = charge(row)
            charges[charge.jobId] = (charge, network)
        }

        // 3. The users, and each reservation's windows in its user's zone.
        var users: [String: UserRow] = [:]
        if !reserving.isEmpty {
            for (id, plan, zone, endsAt) in try await db.allRows(
                "SELECT id, \(unescaped: userColumns) FROM quota_user WHERE id = ANY(\(Array(reserving))::text[])",
                as: (String, String, String?, Date?).self, logger: logger
            ) {
                users[id] = (plan, zone, endsAt)
            }
        }
        var contexts: [Int: QuotaLedger.UserContext] = [:]
        var reading: Set<UsageKey> = []
        for (index, operation) in batch.enumerated() {
            guard case .reserve(let request, let now) = operation else { continue }
            let context = userContext(ledger, request.userId, users[request.userId], now: now)
            contexts[index] = context
            reading.insert(UsageKey(owner: request.userId, kind: "daily", key: context.day.key))
            reading.insert(UsageKey(owner: request.userId, kind: "monthly", key: context.month.key))
            if let network = ledger.sharedNetwork(of: request) {
                reading.insert(UsageKey(owner: "net:" + network, kind: "daily", key: context.day.key))
            }
        }

        // 4. Their usage: one primary-key probe per window (the `LIMIT 1` keeps the lateral
        // subquery from being flattened into a join, which PostgreSQL ran as a hash join over the
        // whole table: 2 ms a batch at 26,000 rows, growing with every user).
        var used: [UsageKey: Int] = [:]
        if !reading.isEmpty {
            let keys = Array(reading)
            for (owner, kind, key, value) in try await db.allRows("""
                SELECT k.o, k.w, k.y, u.used
                FROM unnest(\(keys.map(\.owner))::text[], \(keys.map(\.kind))::text[], \(keys.map(\.key))::text[]) AS k(o, w, y)
                CROSS JOIN LATERAL (SELECT used FROM quota_usage WHERE user_id = k.o AND window_kind = k.w AND window_key = k.y LIMIT 1) AS u
                """, as: (String, String, String, Int).self, logger: logger
            ) {
                used[UsageKey(owner: owner, kind: kind, key: key)] = value
            }
        }

        // 5. Which guests are attested (their network's credits are not shared).
        var attested: Set<String> = []
        let guests = batch.compactMap { operation -> String? in
            guard case .reserve(let request, _) = operation, ledger.sharedNetwork(of: request) != nil else { return nil }
            return request.userId
        }
        if !guests.isEmpty {
            attested = Set(try await db.all(
                "SELECT user_id FROM quota_guest WHERE user_id = ANY(\(guests)::text[]) AND attested_key IS NOT NULL", as: String.self, logger: logger
            ))
        }

        // The decisions, in order.
        var changes: [UsageKey: Int] = [:]
        var written: Set<String> = []
        func change(_ key: UsageKey, by amount: Int) {
            if let value = used[key] { used[key] = max(0, value + amount) } else if amount > 0 { used[key] = amount }
            changes[key, default: 0] += amount
        }
        var results: [Result<Outcome, any Error>] = []
        results.reserveCapacity(batch.count)
        for (index, operation) in batch.enumerated() {
            switch operation {
            case .reserve(let request, let now):
                var context = contexts[index]!
                let daily = UsageKey(owner: request.userId, kind: "daily", key: context.day.key)
                let monthly = UsageKey(owner: request.userId, kind: "monthly", key: context.month.key)
                context.dailyUsed = used[daily] ?? 0
                context.monthlyUsed = used[monthly] ?? 0
                if let existing = charges[request.jobId] {
                    guard existing.charge.userId == request.userId else {
                        results.append(.failure(BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user")))
                        continue
                    }
                    // Reserved or committed: the same admission again. Released (its job was never
                    // made, or ended without a result): a retry of it is charged afresh, below.
                    if existing.charge.state != .released {
                        results.append(.success(.decision(QuotaDecision(admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil))))
                        continue
                    }
                }
                let verdict = QuotaRules.decide(
                    plan: context.plan, cost: request.cost, dailyUsed: context.dailyUsed, monthlyUsed: context.monthlyUsed,
                    day: context.day, month: context.month
                )
                guard verdict.admitted else {
                    results.append(.success(.decision(QuotaDecision(
                        admitted: false, jobId: request.jobId, status: context.status(), violated: verdict.violated, retryAt: verdict.retryAt
                    ))))
                    continue
                }
                // A guest's network shares the day's free credits of its guests, except with an
                // attested guest.
                var shared = ledger.sharedNetwork(of: request)
                if attested.contains(request.userId) { shared = nil }
                if let network = shared {
                    let networkUsed = used[UsageKey(owner: "net:" + network, kind: "daily", key: context.day.key)] ?? 0
                    if networkUsed + request.cost > ledger.guests.networkDaily {
                        results.append(.success(.decision(QuotaDecision(
                            admitted: false, jobId: request.jobId, status: context.status(), violated: ["network"],
                            retryAt: context.day.end, networkRemaining: max(0, ledger.guests.networkDaily - networkUsed)
                        ))))
                        continue
                    }
                    change(UsageKey(owner: "net:" + network, kind: "daily", key: context.day.key), by: request.cost)
                }
                change(daily, by: request.cost)
                change(monthly, by: request.cost)
                charges[request.jobId] = (
                    Charge(jobId: request.jobId, userId: request.userId, cost: request.cost, state: .reserved,
                           dayKey: context.day.key, monthKey: context.month.key, reservedAt: now, settledAt: nil),
                    shared
                )
                written.insert(request.jobId)
                context.dailyUsed += request.cost
                context.monthlyUsed += request.cost
                results.append(.success(.decision(QuotaDecision(admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil))))

            case .settle(let jobId, let state, let now):
                guard let (stored, network) = charges[jobId] else {
                    results.append(.failure(BusError(.notFound, "no charge for job \(jobId)")))
                    continue
                }
                var charge = stored
                switch (charge.state, state) {
                case (.committed, .committed), (.released, .released):
                    results.append(.success(.charge(charge)))
                    continue
                case (.released, _):
                    results.append(.failure(BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was released; it cannot be committed")))
                    continue
                case (.committed, _):
                    results.append(.failure(BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was committed; it cannot be released")))
                    continue
                case (.reserved, _):
                    break
                }
                if state == .released {
                    change(UsageKey(owner: charge.userId, kind: "daily", key: charge.dayKey), by: -charge.cost)
                    change(UsageKey(owner: charge.userId, kind: "monthly", key: charge.monthKey), by: -charge.cost)
                    if let network { change(UsageKey(owner: "net:" + network, kind: "daily", key: charge.dayKey), by: -charge.cost) }
                }
                charge.state = state
                charge.settledAt = now
                charges[jobId] = (charge, network)
                written.insert(jobId)
                results.append(.success(.charge(charge)))
            }
        }

        // 6. The charges made or settled. A new job id charged by another user meanwhile is not
        // overwritten: the batch is run again and then finds it.
        if !written.isEmpty {
            let rows = written.sorted().map { charges[$0]! }
            let count = try await db.all("""
                INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at, network)
                SELECT j, u, c, s, d, m, r, CASE WHEN settled THEN t END, NULLIF(n, '')
                FROM unnest(\(rows.map(\.charge.jobId))::text[], \(rows.map(\.charge.userId))::text[], \(rows.map(\.charge.cost))::bigint[],
                            \(rows.map(\.charge.state.rawValue))::text[], \(rows.map(\.charge.dayKey))::text[], \(rows.map(\.charge.monthKey))::text[],
                            \(rows.map(\.charge.reservedAt))::timestamptz[], \(rows.map { $0.charge.settledAt != nil })::bool[],
                            \(rows.map { $0.charge.settledAt ?? $0.charge.reservedAt })::timestamptz[], \(rows.map { $0.network ?? "" })::text[])
                    AS row(j, u, c, s, d, m, r, settled, t, n)
                ORDER BY j
                ON CONFLICT (job_id) DO UPDATE SET cost = excluded.cost, state = excluded.state, day_key = excluded.day_key,
                    month_key = excluded.month_key, reserved_at = excluded.reserved_at, settled_at = excluded.settled_at, network = excluded.network
                    WHERE quota_charge.user_id = excluded.user_id
                RETURNING 1
                """, as: Int32.self, logger: logger).count
            guard count == rows.count else { throw JobIdTakenMeanwhile() }
        }

        // 7. The windows' changes (a release's row is there: its reservation made it). The
        // release's check is a scalar probe per row, not an `EXISTS`, which PostgreSQL hashed over
        // the whole table.
        let moved = changes.filter { $0.value != 0 }.sorted { ($0.key.owner, $0.key.kind, $0.key.key) < ($1.key.owner, $1.key.kind, $1.key.key) }
        if !moved.isEmpty {
            try await db.query("""
                INSERT INTO quota_usage (user_id, window_kind, window_key, used)
                SELECT o, k, w, a FROM unnest(\(moved.map(\.key.owner))::text[], \(moved.map(\.key.kind))::text[], \(moved.map(\.key.key))::text[],
                                              \(moved.map(\.value))::bigint[]) AS change(o, k, w, a)
                WHERE a > 0 OR (SELECT true FROM quota_usage q WHERE q.user_id = o AND q.window_kind = k AND q.window_key = w LIMIT 1)
                ORDER BY o, k, w
                ON CONFLICT (user_id, window_kind, window_key) DO UPDATE SET used = greatest(0, quota_usage.used + excluded.used)
                """, logger: logger)
        }
        return results
    }
}
