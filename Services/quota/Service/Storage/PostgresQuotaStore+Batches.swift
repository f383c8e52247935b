import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
import Storage

/// Reservations, commits and releases decided in batches (`PostgresBatcher`): one transaction per
/// batch, and two statements in it whatever its size:
///
/// 1. one call of `quota_batch_read` (migration v5), which takes the advisory locks of the batch's
///    users and guest networks in one fixed order (by their hash), so two replicas' batches never
///    wait for each other in a circle, and then reads the charges of its job ids, locked in job
///    id order (`FOR UPDATE`: a commit or release holds its charge, and a reservation learns
///    whether its job id is already charged), the users' rows, their windows' usage (the day and
///    month in UTC, and for a user whose row names a zone, in every zone it could be in) and
///    which guests are attested;
/// 2. every charge made or settled, as one ordered upsert, and every window's change, as
///    another, in one statement (`BatchWrite`, prepared).
///
/// Between the two the batch is decided in order, by the same rules as one decision at a time
/// (`QuotaRules`): a later operation sees what an earlier one in the batch did. Rows are locked in
/// the same order by every batch (advisory locks, then charges, then usage, each sorted), which is
/// why batches on two replicas do not deadlock; were PostgreSQL to report one anyway, or a job id
/// taken by another user's batch in between, the batch is run again from the start. With BEGIN
/// and COMMIT, a batch is four round trips (it was nine, one a statement: the round trips,
/// PostgreSQL's and the service's wake-ups for each, were most of both processes' CPU); the
/// deadline is set by the first call, not by a `SET LOCAL` of its own.
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
                return try await database.transactionSettingItsTimeout { db, timeout in
                    try await decide(batch, db, timeout: timeout, ledger: ledger, logger: logger)
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

    /// UTC and the zones furthest west (UTC-12) and east (UTC+14): their days and months are those
    /// of every zone at the same instant.
    static let outermostZones = ["Etc/GMT+12", "UTC", "Etc/GMT-14"]

    /// A window's usage row.
    struct UsageKey: Hashable {
        var owner: String
        var kind: String
        var key: String
    }

    private static func decide(_ batch: [Operation], _ db: PostgresConnection, timeout: Int?, ledger: QuotaLedger, logger: Logger) async throws -> [Result<Outcome, any Error>] {
        var reserving: Set<String> = []
        var networks: Set<String> = []
        for operation in batch {
            guard case .reserve(let request, _) = operation else { continue }
            reserving.insert(request.userId)
            if let network = ledger.sharedNetwork(of: request) { networks.insert(network) }
        }

        // The windows a reservation may read: the day and month of each owner (the user, its
        // shared network) in the zones furthest west and east, and in UTC, which hold the day and
        // month in any zone (a zone's is found below, once its user's row is read).
        var owners: Set<String> = []
        var nows: Set<Date> = []
        for operation in batch {
            guard case .reserve(let request, let now) = operation else { continue }
            owners.insert(request.userId)
            if let network = ledger.sharedNetwork(of: request) { owners.insert("net:" + network) }
            nows.insert(now)
        }
        var days: Set<String> = []
        var months: Set<String> = []
        // Those of UTC, what a user without a zone uses: read whatever the users' zones.
        var utcDays: Set<String> = []
        var utcMonths: Set<String> = []
        for now in nows {
            for zone in Self.outermostZones {
                let (day, month) = ledger.windows.windows(containing: now, timeZone: zone)
                days.insert(day.key)
                months.insert(month.key)
            }
            let (day, month) = ledger.windows.windows(containing: now, timeZone: nil)
            utcDays.insert(day.key)
            utcMonths.insert(month.key)
        }
        var candidates: Set<UsageKey> = []
        for owner in owners {
            for day in days { candidates.insert(UsageKey(owner: owner, kind: "daily", key: day)) }
            guard !owner.hasPrefix("net:") else { continue }
            for month in months { candidates.insert(UsageKey(owner: owner, kind: "monthly", key: month)) }
        }
        let guests = batch.compactMap { operation -> String? in
            guard case .reserve(let request, _) = operation, ledger.sharedNetwork(of: request) != nil else { return nil }
            return request.userId
        }

        // 1-5. The deadline, the locks (users and networks, in one order), then the charges of
        // the batch's job ids (locked: `FOR UPDATE`), the users, those windows' usage and which
        // guests are attested (their network's credits are not shared): one call
        // (`quota_batch_read`). A user's windows of other zones than UTC are read only if its row
        // names a zone; a network's, always (its guests' zones decide which it uses).
        var charges: [String: (charge: Charge, network: String?)] = [:]
        var users: [String: UserRow] = [:]
        var used: [UsageKey: Int] = [:]
        var attested: Set<String> = []
        let jobIds = Set(batch.map(\.jobId)).sorted()
        let locks = reserving.map { "quota:user:" + $0 } + networks.map { "quota:network:" + $0 }
        let reading = Array(candidates)
        let always = reading.map { key in
            key.owner.hasPrefix("net:") || (key.kind == "daily" ? utcDays : utcMonths).contains(key.key)
        }
        for row in try await db.allRows("""
            SELECT * FROM quota_batch_read(\(timeout.map(Int64.init))::bigint, \(locks)::text[], \(jobIds)::text[], \(Array(reserving))::text[],
                \(reading.map(\.owner))::text[], \(reading.map(\.kind))::text[], \(reading.map(\.key))::text[], \(always)::boolean[], \(guests)::text[])
            """, as: (String, String, String?, Int?, String?, String?, String?, Date?, Date?, String?).self, logger: logger
        ) {
            switch row.0 {
            case "c":
                guard let user = row.2, let cost = row.3, let state = row.4, let day = row.5, let month = row.6, let reservedAt = row.7 else { continue }
                let (charge, network) = charge((row.1, user, cost, state, day, month, reservedAt, row.8, row.9))
                charges[charge.jobId] = (charge, network)
            case "u":
                guard let plan = row.4 else { continue }
                users[row.1] = (plan, row.5, row.7)
            case "w":
                guard let kind = row.2, let key = row.4, let value = row.3 else { continue }
                used[UsageKey(owner: row.1, kind: kind, key: key)] = value
            case "g":
                attested.insert(row.1)
            default:
                continue
            }
        }

        // Each reservation's windows in its user's zone. One the call did not read (a zone past
        // those above: none today) is read now.
        var contexts: [Int: QuotaLedger.UserContext] = [:]
        var missing: Set<UsageKey> = []
        for (index, operation) in batch.enumerated() {
            guard case .reserve(let request, let now) = operation else { continue }
            let context = userContext(ledger, request.userId, users[request.userId], now: now)
            contexts[index] = context
            var wanted = [UsageKey(owner: request.userId, kind: "daily", key: context.day.key),
                          UsageKey(owner: request.userId, kind: "monthly", key: context.month.key)]
            if let network = ledger.sharedNetwork(of: request) {
                wanted.append(UsageKey(owner: "net:" + network, kind: "daily", key: context.day.key))
            }
            for key in wanted where !candidates.contains(key) { missing.insert(key) }
        }
        if !missing.isEmpty {
            let keys = Array(missing)
            for (owner, kind, key, value) in try await db.allRows("""
                SELECT k.o, k.w, k.y, u.used
                FROM unnest(\(keys.map(\.owner))::text[], \(keys.map(\.kind))::text[], \(keys.map(\.key))::text[]) AS k(o, w, y)
                CROSS JOIN LATERAL (SELECT used FROM quota_usage WHERE user_id = k.o AND window_kind = k.w AND window_key = k.y LIMIT 1) AS u
                """, as: (String, String, String, Int).self, logger: logger
            ) {
                used[UsageKey(owner: owner, kind: kind, key: key)] = value
            }
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
                        results.append(.success(.decision(QuotaDecision(
                            admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil, replayed: true
                        ))))
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

        // 6-7. The charges made or settled, as one ordered upsert, and the windows' changes, as
        // another, in one statement (`BatchWrite`). A new job id charged by another user
        // meanwhile is not overwritten: the batch is run again and then finds it.
        let rows = written.sorted().map { charges[$0]! }
        let moved = changes.filter { $0.value != 0 }.sorted { ($0.key.owner, $0.key.kind, $0.key.key) < ($1.key.owner, $1.key.kind, $1.key.key) }
        if !rows.isEmpty || !moved.isEmpty {
            var bindings = PostgresBindings(capacity: 14)
            bindings.append(rows.map(\.charge.jobId))
            bindings.append(rows.map(\.charge.userId))
            bindings.append(rows.map(\.charge.cost))
            bindings.append(rows.map(\.charge.state.rawValue))
            bindings.append(rows.map(\.charge.dayKey))
            bindings.append(rows.map(\.charge.monthKey))
            bindings.append(rows.map(\.charge.reservedAt))
            bindings.append(rows.map { $0.charge.settledAt != nil })
            bindings.append(rows.map { $0.charge.settledAt ?? $0.charge.reservedAt })
            bindings.append(rows.map { $0.network ?? "" })
            bindings.append(moved.map(\.key.owner))
            bindings.append(moved.map(\.key.kind))
            bindings.append(moved.map(\.key.key))
            bindings.append(moved.map(\.value))
            var count = 0
            for try await charged in try await db.execute(BatchWrite(bindings: bindings), logger: logger) { count = charged }
            guard count == rows.count else { throw JobIdTakenMeanwhile() }
        }
        return results
    }

    /// A batch's writes: the charges made or settled, as one upsert in job id order, and the
    /// windows' changes, as another in key order; answers how many charges were written. A
    /// release's window row is there (its reservation made it); its check is a scalar probe per
    /// row, not an `EXISTS`, which PostgreSQL hashed over the whole table. One call of
    /// `quota_batch_write` (migration v6, which says why it is a function), prepared by
    /// postgres-nio once per connection, by name: parsing and planning the statement again at
    /// every batch were a sixth of the PostgreSQL backend's time (perf).
    struct BatchWrite: PostgresPreparedStatement {
        typealias Row = Int
        static let name = "quota_batch_write"
        static let sql = """
            SELECT quota_batch_write($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::bool[],
                                     $9::timestamptz[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bigint[])
            """
        var bindings: PostgresBindings

        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws -> Int { try row.decode(Int.self) }
    }
}
