import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
import Storage

/// Reservations, commits and releases decided in batches (`PostgresBatcher`): one transaction per
/// batch, and one round trip whatever its size, a call of `quota_batch_decide_and_commit`
/// (migration v8), which commits what `quota_batch_decide` (v7) did and answers once the commit
/// is durable. The function
///
/// 1. takes the advisory locks of the batch's users and guest networks in one fixed order (by
///    their hash), so two replicas' batches never wait for each other in a circle;
/// 2. reads the users' rows, and stops there if a user's zone is not the one this replica made
///    its windows' keys in (`ZoneCache`): the replica learns the zones it is told, and runs the
///    batch again;
/// 3. reads the charges of the batch's job ids, locked in job id order (`FOR UPDATE`), the usage of
///    each reservation's day and month (and its guest network's day) and which guests are
///    attested;
/// 4. decides the operations in order, by the same rules as `QuotaRules` and the SQLite ledger: a
///    later operation sees what an earlier one in the batch did;
/// 5. inserts the charges made and updates those settled or charged again, each in job id order,
///    and applies every window's change, in key order;
/// 6. answers one row per operation, from which the replica makes its answer (statuses and
///    windows, made in Swift as every other store makes them).
///
/// The decisions moved into PostgreSQL so that a batch is one call: it was BEGIN, a read, the
/// decisions in Swift, a write and COMMIT, then BEGIN, the call and COMMIT (docs/quota.md has the
/// figures). What stays in Swift is what needs Foundation: a window's key, bounds and reset time in
/// a zone, and the answers.
/// Rows are locked in the same order by every batch (advisory locks, then charges, then usage,
/// each sorted), which is why batches on two replicas do not deadlock; were PostgreSQL to report
/// one anyway, or a new job id be charged by another user's batch in between (the call's insert
/// then fails, `unique_violation`), the batch is run again from the start.
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

        var now: Date {
            switch self {
            case .reserve(_, let now), .settle(_, _, let now): now
            }
        }
    }

    enum Outcome: Sendable {
        case decision(QuotaDecision)
        case charge(Charge)
    }

    /// How many times a batch is run again after a deadlock, a job id taken in between, or a zone
    /// it was told of (each counted on its own).
    static let batchAttempts = 3

    /// Decides `batch` in one transaction (see the extension's notes).
    static func decide(
        _ batch: [Operation], database: PostgresPool, ledger: QuotaLedger, zones: ZoneCache, logger: Logger
    ) async throws -> [Result<Outcome, any Error>] {
        var attempt = 1
        var zoneAttempt = 1
        while true {
            do {
                let called = try await database.connectionSettingItsTimeout { db, timeout in
                    try await decide(batch, db, timeout: timeout, ledger: ledger, zones: zones, logger: logger)
                }
                switch called {
                case .decided(let results):
                    return results
                case .zonesDiffer(let found):
                    // Keys made in a zone a user no longer has (or never had, as far as this
                    // replica knew): learn the zones, and decide the batch again.
                    for (user, zone) in found { zones.learn(user: user, zone: zone) }
                    guard zoneAttempt < batchAttempts else { throw ZonesChangedMeanwhile() }
                    zoneAttempt += 1
                    logger.debug("quota batch run again: users' zones were not those its windows were made in")
                    continue
                }
            } catch let error as PSQLError where attempt < batchAttempts && ["40P01", "40001", "23505"].contains(error.serverInfo?[.sqlState] ?? "") {
                logger.debug("quota batch run again", metadata: ["sqlState": "\(error.serverInfo?[.sqlState] ?? "")"])
            }
            attempt += 1
        }
    }

    /// The users' zones changed at every attempt of a batch (each attempt learns them first).
    struct ZonesChangedMeanwhile: Error, CustomStringConvertible {
        var description: String { "users' time zones changed while their reservations were decided; try again" }
    }

    /// What one call came to: an answer per operation, or the zones of users whose windows were
    /// made in another (nothing was decided).
    enum Called: Sendable {
        case decided([Result<Outcome, any Error>])
        case zonesDiffer([(user: String, zone: String?)])
    }

    /// One call of `quota_batch_decide_and_commit` on `db`, outside a transaction: decided and
    /// committed when it answers.
    static func decide(
        _ batch: [Operation], _ db: PostgresConnection, timeout: Int?, ledger: QuotaLedger, zones: ZoneCache, logger: Logger
    ) async throws -> Called {
        // Each operation's columns; a settlement's are empty but for its job id and time.
        var kinds: [String] = [], jobs: [String] = [], users: [String] = [], costs: [Int] = [], nows: [Date] = []
        var assumed: [String] = [], days: [String] = [], months: [String] = [], networks: [String] = []
        var locks: Set<String> = []
        kinds.reserveCapacity(batch.count)
        for operation in batch {
            switch operation {
            case .reserve(let request, let now):
                let zone = zones.zone(of: request.userId)
                let (day, month) = ledger.windows.windows(containing: now, timeZone: zone)
                let network = ledger.sharedNetwork(of: request)
                kinds.append("r"); users.append(request.userId); costs.append(request.cost)
                assumed.append(zone ?? ""); days.append(day.key); months.append(month.key); networks.append(network ?? "")
                locks.insert("quota:user:" + request.userId)
                if let network { locks.insert("quota:network:" + network) }
            case .settle(_, let state, _):
                kinds.append(state == .released ? "x" : "c"); users.append(""); costs.append(0)
                assumed.append(""); days.append(""); months.append(""); networks.append("")
            }
            jobs.append(operation.jobId)
            nows.append(operation.now)
        }
        let plans = ledger.plans.plans.values.sorted { $0.name < $1.name }

        var bindings = PostgresBindings(capacity: 16)
        bindings.append(timeout.map(Int64.init))
        bindings.append(Array(locks))
        bindings.append(kinds)
        bindings.append(jobs)
        bindings.append(users)
        bindings.append(costs)
        bindings.append(nows)
        bindings.append(assumed)
        bindings.append(days)
        bindings.append(months)
        bindings.append(networks)
        bindings.append(plans.map(\.name))
        // (-1: no limit)
        bindings.append(plans.map { $0.dailyLimit ?? -1 })
        bindings.append(plans.map { $0.monthlyLimit ?? -1 })
        bindings.append(ledger.plans.defaultPlan)
        bindings.append(ledger.guests.networkDaily)

        var results = [Result<Outcome, any Error>?](repeating: nil, count: batch.count)
        var differ: [(user: String, zone: String?)] = []
        for try await rows in try await db.execute(BatchDecide(bindings: bindings), logger: logger) {
            for row in rows {
                let index = Int(row.op) - 1
                if row.code == "zone" {
                    differ.append((row.a ?? "", row.state.flatMap { $0.isEmpty ? nil : $0 }))
                    continue
                }
                guard batch.indices.contains(index) else { continue }
                results[index] = answer(row, to: batch[index], zone: assumed[index], ledger: ledger)
            }
        }
        if !differ.isEmpty { return .zonesDiffer(differ) }
        return .decided(try results.map { result in
            guard let result else { throw BatchAnswerMissing() }
            return result
        })
    }

    /// The call answered no row for an operation (it answers one for each).
    struct BatchAnswerMissing: Error, CustomStringConvertible {
        var description: String { "quota_batch_decide answered no row for an operation" }
    }

    /// An operation's answer from its row: a reservation's decision, with its user's status made
    /// here (windows need Foundation's calendar), or a settlement's charge.
    static func answer(_ row: BatchDecide.OperationRow, to operation: Operation, zone: String, ledger: QuotaLedger) -> Result<Outcome, any Error> {
        switch operation {
        case .reserve(let request, let now):
            var context = userContext(ledger, request.userId, row.plan.map { ($0, zone.isEmpty ? nil : zone, row.planEndsAt) }, now: now)
            context.dailyUsed = row.daily ?? 0
            context.monthlyUsed = row.monthly ?? 0
            switch row.code {
            case "taken":
                return .failure(BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user"))
            case "replayed":
                return .success(.decision(QuotaDecision(admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil, replayed: true)))
            case "admitted":
                return .success(.decision(QuotaDecision(admitted: true, jobId: request.jobId, status: context.status(), violated: [], retryAt: nil)))
            case "network":
                let used = row.network ?? 0
                return .success(.decision(QuotaDecision(
                    admitted: false, jobId: request.jobId, status: context.status(), violated: ["network"],
                    retryAt: context.day.end, networkRemaining: max(0, ledger.guests.networkDaily - used)
                )))
            case "refused":
                let verdict = QuotaRules.decide(
                    plan: context.plan, cost: request.cost, dailyUsed: context.dailyUsed, monthlyUsed: context.monthlyUsed,
                    day: context.day, month: context.month
                )
                return .success(.decision(QuotaDecision(
                    admitted: false, jobId: request.jobId, status: context.status(), violated: verdict.violated, retryAt: verdict.retryAt
                )))
            default:
                return .failure(BusError(.internal, "quota_batch_decide answered '\(row.code.prefix(32))' for a reservation"))
            }
        case .settle(let jobId, _, _):
            guard row.code == "charge" || row.code == "settled" || row.code == "notfound" else {
                return .failure(BusError(.internal, "quota_batch_decide answered '\(row.code.prefix(32))' for a settlement"))
            }
            guard row.code != "notfound", let user = row.a, let cost = row.cost, let state = row.state.flatMap(Charge.State.init(rawValue:)),
                  let day = row.day, let month = row.month, let reservedAt = row.reservedAt else {
                return .failure(BusError(.notFound, "no charge for job \(jobId)"))
            }
            let charge = Charge(jobId: jobId, userId: user, cost: cost, state: state, dayKey: day, monthKey: month, reservedAt: reservedAt, settledAt: row.settledAt)
            guard row.code == "settled" else { return .success(.charge(charge)) }
            return .failure(BusError(
                Quota.ErrorCode.chargeSettled,
                state == .released ? "charge \(jobId) was released; it cannot be committed" : "charge \(jobId) was committed; it cannot be released"
            ))
        }
    }

    /// The call of a batch, prepared by postgres-nio once per connection (by name): parsing and
    /// planning a statement again at every batch were a sixth of the PostgreSQL backend's time
    /// (perf), when the write was a statement of its own. Its one row holds an array a column
    /// (migration v8), made here into a `Row` an operation.
    struct BatchDecide: PostgresPreparedStatement {
        /// The call's row: an operation's answer each.
        typealias Row = [OperationRow]

        /// A row of `quota_batch_decide`'s answer (migration v7 has its columns' order).
        struct OperationRow {
            /// The operation's place in the batch, from 1 (0 for a `zone` row).
            var op: Int32
            /// A reservation's `admitted`, `replayed`, `refused`, `network` or `taken`; a
            /// settlement's `charge`, `settled` (the other way already) or `notfound`; `zone`.
            var code: String
            /// A settled charge's user; a `zone` row's user.
            var a: String?
            var cost: Int?
            /// A settled charge's state; a `zone` row's zone ("" for none).
            var state: String?
            var day: String?
            var month: String?
            var reservedAt: Date?
            var settledAt: Date?
            /// A reservation's user's day and month as its answer shows them (after it, if admitted).
            var daily: Int?
            var monthly: Int?
            /// What the guest network's day had used, for a reservation that drew on it.
            var network: Int?
            /// The user's row's plan and its end, as stored (nil: no row).
            var plan: String?
            var planEndsAt: Date?
        }

        static let name = "quota_batch_decide_and_commit"
        static let sql = """
            CALL quota_batch_decide_and_commit($1::bigint, $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[],
                $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bigint[], $14::bigint[], $15::text, $16::bigint)
            """
        var bindings: PostgresBindings

        func makeBindings() throws -> PostgresBindings { bindings }
        func decodeRow(_ row: PostgresRow) throws -> Row {
            let (ops, codes, nulls, a, cost, state, day, month, reservedAt, settledAt, daily, monthly, network, plan, planEndsAt) = try row.decode(
                ([Int32], [String], [Int32], [String], [Int], [String], [String], [String], [Date], [Date], [Int], [Int], [Int], [String], [Date]).self
            )
            let count = ops.count
            guard [codes.count, nulls.count, a.count, cost.count, state.count, day.count, month.count, reservedAt.count, settledAt.count,
                   daily.count, monthly.count, network.count, plan.count, planEndsAt.count].allSatisfy({ $0 == count }) else {
                throw BatchAnswerMissing()
            }
            return (0..<count).map { i in
                // (bit k of `nulls`: the k-th column after `code` is NULL)
                func given<T>(_ bit: Int32, _ value: T) -> T? { nulls[i] & bit == 0 ? value : nil }
                return OperationRow(
                    op: ops[i], code: codes[i], a: given(1, a[i]), cost: given(2, cost[i]), state: given(4, state[i]), day: given(8, day[i]),
                    month: given(16, month[i]), reservedAt: given(32, reservedAt[i]), settledAt: given(64, settledAt[i]), daily: given(128, daily[i]),
                    monthly: given(256, monthly[i]), network: given(512, network[i]), plan: given(1024, plan[i]), planEndsAt: given(2048, planEndsAt[i])
                )
            }
        }
    }
}
