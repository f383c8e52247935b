import Foundation
import GRDB
import Messages
import QuotaCore

/// The quota windows and charges of active users, in memory: the authority for every decision.
/// Owned by the ledger's thread (`QuotaEngine`), which is the only one to touch it.
///
/// Memory is a cache over the tables in front of the log: what it does not hold, the tables have
/// exactly, because a counter or a charge changed since the last checkpoint is never dropped (each
/// entry remembers the sequence number of its last change, and only entries at or below the
/// checkpointer's `appliedSeq` are evicted). So a miss reads the tables, and a restart, which
/// first applies the log's tail to the tables, rebuilds the same memory as users come back.
///
/// A decision changes memory, and appends a `LedgerChange` that the engine writes to the log and
/// syncs before it answers. If that write fails, `rollBack()` puts memory back as it was before the
/// batch, so memory never holds what the log does not.
struct QuotaMemory {
    /// A user's plan row (users without one are on the default plan, in UTC), and whether they are
    /// a guest whose device was attested. Always what the tables hold: the rare writes that
    /// change them write the tables first, then here.
    struct UserEntry {
        var plan: String?
        var timeZone: String?
        var planEndsAt: Date?
        /// Read when first needed (only a reserve on a guest network asks).
        var attested: Bool?

        static let none = UserEntry(plan: nil, timeZone: nil, planEndsAt: nil, attested: nil)
    }

    struct CounterEntry {
        var used: Int
        var seq: UInt64
    }

    struct ChargeEntry {
        var change: LedgerChange
        var seq: UInt64 { change.seq }
    }

    /// The most entries kept of each kind before those already in the tables are dropped; and
    /// the most job ids `known` holds (about 40 bytes each for the gateway's UUIDs) before it is
    /// given up for reads of the tables.
    struct Capacity {
        var users = 100_000
        var counters = 300_000
        var charges = 300_000
        var jobIds = 2_000_000
    }

    let ledger: QuotaLedger
    let reader: any DatabaseReader
    let capacity: Capacity

    private(set) var users: [String: UserEntry] = [:]
    private(set) var counters: [UsageCounter: CounterEntry] = [:]
    private(set) var charges: [String: ChargeEntry] = [:]
    /// Every job id with a charge in memory or the tables, when `knownWhole` (the tables keep only
    /// the idempotency window's charges, which `forget` prunes): a new job id, the common case,
    /// is then known to be new without a read. Each with the sequence number of its last change
    /// (0: older than this process), so that forgetting an id the tables no longer hold keeps one
    /// charged again since.
    private var known: [JobKey: UInt64] = [:]
    private var knownWhole = false
    /// The last sequence number given out.
    private(set) var lastSeq: UInt64
    /// The checkpointer's progress, as last heard (entries at or below it may be dropped).
    var appliedSeq: UInt64
    /// This batch's changes, to be written to the log.
    private(set) var changes: [LedgerChange] = []
    private var undo: [Undo] = []
    /// Job ids this batch's prefetch found in neither memory nor the tables.
    private var absentCharges: Set<String> = []
    /// Whether every plan row is in memory (`warm`), and the first day and month key from which
    /// every usage counter is.
    private var usersWhole = false
    private var wholeFrom = (day: QuotaMemory.nothingWhole, month: QuotaMemory.nothingWhole)
    private var sweepAbove: (counters: Int, charges: Int)

    private enum Undo {
        case counter(UsageCounter, CounterEntry?)
        case charge(String, ChargeEntry?)
    }

    init(ledger: QuotaLedger, reader: any DatabaseReader, lastSeq: UInt64, capacity: Capacity = Capacity()) {
        self.ledger = ledger
        self.reader = reader
        self.capacity = capacity
        self.lastSeq = lastSeq
        self.appliedSeq = lastSeq
        sweepAbove = (capacity.counters, capacity.charges)
    }

    // MARK: Decisions

    /// Charges `request.cost` in both windows (and the guest network's day), or denies naming the
    /// windows that refuse. A job id already charged answers its admission again; a released one
    /// is charged afresh.
    mutating func reserve(_ request: ReserveQuota, now: Date) throws -> QuotaDecision {
        try ledger.check(request)
        if let existing = try charge(request.jobId) {
            guard existing.change.userId == request.userId else {
                throw BusError(Quota.ErrorCode.jobIdTaken, "job id \(request.jobId) belongs to another user")
            }
            if existing.change.state != .released {
                return QuotaDecision(admitted: true, jobId: request.jobId, status: try context(request.userId, now: now).status(), violated: [], retryAt: nil,
                                     replayed: true)
            }
        }
        let context = try context(request.userId, now: now)
        let verdict = QuotaRules.decide(
            plan: context.plan, cost: request.cost, dailyUsed: context.dailyUsed, monthlyUsed: context.monthlyUsed,
            day: context.day, month: context.month
        )
        guard verdict.admitted else {
            return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: verdict.violated, retryAt: verdict.retryAt)
        }
        // A guest's network shares the day's free credits of all its guests, except with an
        // attested guest: a real install of the app, however many share its address.
        var network = ledger.sharedNetwork(of: request)
        if network != nil, try attested(request.userId) { network = nil }
        var networkCounter: (UsageCounter, Int)?
        if let network {
            let counter = UsageCounter(owner: "net:" + network, window: CalendarWindow.Kind.daily.rawValue, key: context.day.key)
            let used = try used(counter)
            if used + request.cost > ledger.guests.networkDaily {
                return QuotaDecision(admitted: false, jobId: request.jobId, status: context.status(), violated: ["network"],
                                     retryAt: context.day.end, networkRemaining: max(0, ledger.guests.networkDaily - used))
            }
            networkCounter = (counter, used + request.cost)
        }
        var usage = [
            LedgerChange.Usage(counter: Self.counter(request.userId, context.day), used: context.dailyUsed + request.cost),
            LedgerChange.Usage(counter: Self.counter(request.userId, context.month), used: context.monthlyUsed + request.cost),
        ]
        if let (counter, used) = networkCounter { usage.append(LedgerChange.Usage(counter: counter, used: used)) }
        record(LedgerChange(
            seq: 0, jobId: request.jobId, userId: request.userId, cost: request.cost, state: .reserved,
            dayKey: context.day.key, monthKey: context.month.key, network: network,
            reservedAt: Self.millisecond(now), settledAt: nil, usage: usage
        ))
        var charged = context
        charged.dailyUsed += request.cost
        charged.monthlyUsed += request.cost
        return QuotaDecision(admitted: true, jobId: request.jobId, status: charged.status(), violated: [], retryAt: nil)
    }

    /// The job completed: its charge stays. Committing twice is harmless; a released charge is
    /// refused.
    mutating func commit(jobId: String, now: Date) throws -> Charge {
        var change = try existingCharge(jobId)
        switch change.state {
        case .committed: return change.charge
        case .released: throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was released; it cannot be committed")
        case .reserved:
            change.state = .committed
            change.settledAt = Self.millisecond(now)
            change.usage = []
            record(change)
            return change.charge
        }
    }

    /// The job did not complete: its cost goes back to the windows it was charged in (not the
    /// current ones). Releasing twice gives back once; a committed charge is refused.
    mutating func release(jobId: String, now: Date) throws -> Charge {
        var change = try existingCharge(jobId)
        switch change.state {
        case .released: return change.charge
        case .committed: throw BusError(Quota.ErrorCode.chargeSettled, "charge \(jobId) was committed; it cannot be released")
        case .reserved:
            var counters = [
                UsageCounter(owner: change.userId, window: CalendarWindow.Kind.daily.rawValue, key: change.dayKey),
                UsageCounter(owner: change.userId, window: CalendarWindow.Kind.monthly.rawValue, key: change.monthKey),
            ]
            if let network = change.network {
                counters.append(UsageCounter(owner: "net:" + network, window: CalendarWindow.Kind.daily.rawValue, key: change.dayKey))
            }
            // Not clamped at zero: a grant may have left the window below it.
            change.usage = try counters.map { LedgerChange.Usage(counter: $0, used: try used($0) - change.cost) }
            change.state = .released
            change.settledAt = Self.millisecond(now)
            record(change)
            return change.charge
        }
    }

    /// Grants credits (or takes them back) in the user's current day and month: a charge of the
    /// negated amount, settled at once. The same adjustment again changes nothing more.
    mutating func adjust(_ request: AdjustCredits, now: Date) throws -> CreditsAdjusted {
        try ledger.check(request)
        if let existing = try charge(request.chargeId) {
            guard existing.change.userId == request.userId else {
                throw BusError(Quota.ErrorCode.jobIdTaken, "adjustment \(request.adjustmentId) belongs to another user")
            }
            return CreditsAdjusted(applied: false, status: try context(request.userId, now: now).status())
        }
        var context = try context(request.userId, now: now)
        context.dailyUsed -= request.credits
        context.monthlyUsed -= request.credits
        record(LedgerChange(
            seq: 0, jobId: request.chargeId, userId: request.userId, cost: -request.credits, state: .committed,
            dayKey: context.day.key, monthKey: context.month.key, network: nil,
            reservedAt: Self.millisecond(now), settledAt: Self.millisecond(now), usage: [
                LedgerChange.Usage(counter: Self.counter(request.userId, context.day), used: context.dailyUsed),
                LedgerChange.Usage(counter: Self.counter(request.userId, context.month), used: context.monthlyUsed),
            ]
        ))
        return CreditsAdjusted(applied: true, status: context.status())
    }

    /// A user's plan and windows now.
    mutating func status(userId: String, now: Date) throws -> QuotaStatus {
        try ledger.validate(user: userId)
        return try context(userId, now: now).status()
    }

    /// Whether memory knows `jobId`'s charge to be settled (the tables may not say so yet).
    func isSettled(_ jobId: String) -> Bool {
        guard let entry = charges[jobId] else { return false }
        return entry.change.state != .reserved
    }

    /// Reads a user's plan row again, after a rare write changed it.
    mutating func reload(user userId: String) throws {
        users[userId] = try reader.read { try Self.loadUser($0, userId) }
    }

    // MARK: Job ids

    /// Whether memory knows, without a read, that `jobId` has no charge anywhere.
    private func isNew(_ jobId: String) -> Bool {
        knownWhole && known[JobKey(jobId)] == nil
    }

    /// The tables no longer hold these charges (`QuotaDatabase.forget`, in a transaction that saw
    /// every change through `applied`): memory forgets them too, but for an id changed since.
    mutating func forget(_ jobIds: [String], applied: UInt64) {
        for jobId in jobIds {
            let key = JobKey(jobId)
            if let seq = known[key], seq > applied { continue }
            known[key] = nil
            if let entry = charges[jobId], entry.seq <= applied { charges[jobId] = nil }
        }
    }

    /// How many job ids memory knows (nil: too many; it reads the tables instead).
    var knownJobIds: Int? { knownWhole ? known.count : nil }

    // MARK: What memory holds whole

    /// Loads every plan row, and every usage counter of the windows current now in any time
    /// zone (UTC yesterday to tomorrow, and their months), when they fit: memory then holds those
    /// whole, and a user or counter it does not hold needs no read (a new user: the default
    /// plan, nothing used). Counters of later windows are whole too: only this process writes
    /// the tables, through memory.
    mutating func warm(now: Date) throws {
        let utc = TimeZone(identifier: "UTC")!
        let yesterday = now.addingTimeInterval(-86_400)
        let days = (0..<3).map { CalendarWindow(.daily, containing: yesterday.addingTimeInterval(Double($0) * 86_400), in: utc).key }
        let months = Array(Set((0..<3).map { CalendarWindow(.monthly, containing: yesterday.addingTimeInterval(Double($0) * 86_400), in: utc).key }))
        let capacity = capacity
        let loaded = try reader.read { db -> (users: [String: UserEntry]?, counters: [UsageCounter: Int]?) in
            var users: [String: UserEntry]? = [:]
            if try Int.fetchOne(db, sql: "SELECT count(*) FROM user") ?? 0 <= capacity.users / 2 {
                for row in try Row.fetchAll(db, sql: "SELECT id, plan, timeZone, planEndsAt FROM user") {
                    users?[row["id"]] = UserEntry(plan: row["plan"], timeZone: row["timeZone"], planEndsAt: row["planEndsAt"], attested: nil)
                }
            } else {
                users = nil
            }
            var counters: [UsageCounter: Int]? = [:]
            let marks = Array(repeating: "?", count: days.count + months.count).joined(separator: ",")
            let cursor = try Row.fetchCursor(db, sql: "SELECT userId, window, windowKey, used FROM usage WHERE windowKey IN (\(marks))",
                                             arguments: StatementArguments(days + months))
            while let row = try cursor.next() {
                counters?[UsageCounter(owner: row["userId"], window: row["window"], key: row["windowKey"])] = row["used"]
                if (counters?.count ?? 0) > capacity.counters / 2 {
                    counters = nil
                    break
                }
            }
            return (users, counters)
        }
        if let loadedUsers = loaded.users {
            users = loadedUsers
            usersWhole = true
        }
        let jobIds = try reader.read { db -> [String]? in
            guard try Int.fetchOne(db, sql: "SELECT count(*) FROM charge") ?? 0 <= capacity.jobIds / 2 else { return nil }
            return try String.fetchAll(db, sql: "SELECT jobId FROM charge")
        }
        if let jobIds {
            known = Dictionary(jobIds.map { (JobKey($0), 0) }, uniquingKeysWith: max)
            knownWhole = true
        }
        if let loadedCounters = loaded.counters {
            for (counter, used) in loadedCounters { counters[counter] = CounterEntry(used: used, seq: 0) }
            wholeFrom = (days[0], months.min()!)
        }
    }

    /// Whether every counter of `counter`'s window is in memory.
    private func isWhole(_ counter: UsageCounter) -> Bool {
        counter.window == CalendarWindow.Kind.daily.rawValue ? counter.key >= wholeFrom.day : counter.key >= wholeFrom.month
    }

    /// A user's entry if memory knows it without reading.
    private func knownUser(_ userId: String) -> UserEntry? {
        users[userId] ?? (usersWhole ? UserEntry.none : nil)
    }

    /// A counter's value if memory knows it without reading.
    private func knownUsed(_ counter: UsageCounter) -> Int? {
        counters[counter]?.used ?? (isWhole(counter) ? 0 : nil)
    }

    /// Keeps the windows held whole to those still current (UTC yesterday on), so that older
    /// counters may be dropped once the tables hold them.
    private mutating func narrowWhole(now: Date) {
        guard wholeFrom.day != Self.nothingWhole else { return }
        let yesterday = ledger.windows.windows(containing: now.addingTimeInterval(-86_400), timeZone: nil)
        if yesterday.day.key > wholeFrom.day { wholeFrom.day = yesterday.day.key }
        if yesterday.month.key > wholeFrom.month { wholeFrom.month = yesterday.month.key }
    }

    /// A window key above every real one: nothing is held whole.
    private static let nothingWhole = "~"

    // MARK: Loading what memory does not hold

    /// Reads whatever `needs` name that memory lacks, in one read transaction of a few queries
    /// for the whole batch (a batch of first-seen users costs four statements, not five each).
    mutating func prefetch(_ needs: [Need]) throws {
        absentCharges.removeAll(keepingCapacity: true)
        let missing = needs.filter { !holds($0) }
        guard !missing.isEmpty else { return }
        let jobIds = Array(Set(missing.compactMap(\.jobId).filter { charges[$0] == nil && !isNew($0) }))
        let loaded = try load(missing, jobIds: jobIds)
        for (userId, entry) in loaded.users { users[userId] = entry }
        for (counter, used) in loaded.counters where counters[counter] == nil { counters[counter] = CounterEntry(used: used, seq: 0) }
        for (jobId, change) in loaded.charges where charges[jobId] == nil { charges[jobId] = ChargeEntry(change: change) }
        // A job id the tables do not have, they will not have but through memory: remembered
        // for the batch, so its reserve reads nothing more.
        for jobId in jobIds where charges[jobId] == nil { absentCharges.insert(jobId) }
    }

    /// The prefetch's reads (memory is only read here, so its dictionaries are not copied).
    private func load(_ missing: [Need], jobIds: [String]) throws
        -> (users: [String: UserEntry], counters: [UsageCounter: Int], charges: [String: LedgerChange]) {
        let windows = ledger.windows
        let unknownUsers = Set(missing.compactMap(\.userId).filter { knownUser($0) == nil })
        let unknownAttested = Set(missing.filter { $0.network != nil }.compactMap(\.userId).filter { knownUser($0)?.attested == nil })
        var loadedUsers = try reader.read { db in try Self.loadUsers(db, Array(unknownUsers)) }
        var wanted = Set<UsageCounter>()
        for need in missing {
            guard let userId = need.userId, let now = need.now, let entry = knownUser(userId) ?? loadedUsers[userId] else { continue }
            let (day, month) = windows.windows(containing: now, timeZone: entry.timeZone)
            for counter in [Self.counter(userId, day), Self.counter(userId, month)] where knownUsed(counter) == nil { wanted.insert(counter) }
            if let network = need.network {
                let counter = UsageCounter(owner: "net:" + network, window: "daily", key: day.key)
                if knownUsed(counter) == nil { wanted.insert(counter) }
            }
        }
        return try reader.read { db in
            for userId in unknownAttested {
                var entry = loadedUsers[userId] ?? knownUser(userId) ?? .none
                entry.attested = try Self.loadAttested(db, userId)
                loadedUsers[userId] = entry
            }
            return (loadedUsers, try Self.loadUsed(db, Array(wanted)), try Self.loadCharges(db, jobIds))
        }
    }

    /// What a request will read: a user's plan and windows at `now` (and a network's day), a charge.
    struct Need: Sendable {
        var userId: String?
        var now: Date?
        var network: String?
        var jobId: String?
    }

    private func holds(_ need: Need) -> Bool {
        if let jobId = need.jobId, charges[jobId] == nil, !isNew(jobId) { return false }
        guard let userId = need.userId else { return true }
        guard let entry = knownUser(userId) else { return false }
        guard let now = need.now else { return true }
        let (day, month) = ledger.windows.windows(containing: now, timeZone: entry.timeZone)
        if knownUsed(Self.counter(userId, day)) == nil || knownUsed(Self.counter(userId, month)) == nil { return false }
        if let network = need.network {
            if knownUsed(UsageCounter(owner: "net:" + network, window: "daily", key: day.key)) == nil || entry.attested == nil { return false }
        }
        return true
    }

    private mutating func user(_ userId: String) throws -> UserEntry {
        if let entry = knownUser(userId) { return entry }
        let entry = try reader.read { try Self.loadUser($0, userId) }
        users[userId] = entry
        return entry
    }

    private mutating func attested(_ userId: String) throws -> Bool {
        if let attested = try user(userId).attested { return attested }
        let attested = try reader.read { try Self.loadAttested($0, userId) }
        users[userId, default: .none].attested = attested
        return attested
    }

    private mutating func used(_ counter: UsageCounter) throws -> Int {
        if let used = knownUsed(counter) { return used }
        let used = try reader.read { try Self.loadUsed($0, counter) }
        counters[counter] = CounterEntry(used: used, seq: 0)
        return used
    }

    private mutating func charge(_ jobId: String) throws -> ChargeEntry? {
        if let entry = charges[jobId] { return entry }
        if isNew(jobId) || absentCharges.contains(jobId) { return nil }
        guard let change = try reader.read({ try Self.loadCharge($0, jobId) }) else { return nil }
        charges[jobId] = ChargeEntry(change: change)
        return charges[jobId]
    }

    private mutating func existingCharge(_ jobId: String) throws -> LedgerChange {
        try ledger.validate(job: jobId)
        guard let entry = try charge(jobId) else { throw BusError(.notFound, "no charge for job \(jobId)") }
        return entry.change
    }

    /// Rows of `ids` at most this many to a statement.
    private static let chunk = 300

    /// The plan rows of `userIds` (a user without one: the default plan, in UTC, not attested).
    static func loadUsers(_ db: Database, _ userIds: [String]) throws -> [String: UserEntry] {
        var users: [String: UserEntry] = [:]
        for part in stride(from: 0, to: userIds.count, by: chunk).map({ Array(userIds[$0..<min($0 + chunk, userIds.count)]) }) {
            for userId in part { users[userId] = UserEntry(plan: nil, timeZone: nil, planEndsAt: nil, attested: false) }
            let marks = Array(repeating: "?", count: part.count).joined(separator: ",")
            for row in try Row.fetchAll(db, sql: "SELECT id, plan, timeZone, planEndsAt FROM user WHERE id IN (\(marks))", arguments: StatementArguments(part)) {
                users[row["id"]]?.plan = row["plan"]
                users[row["id"]]?.timeZone = row["timeZone"]
                users[row["id"]]?.planEndsAt = row["planEndsAt"]
            }
            for userId in try String.fetchAll(
                db, sql: "SELECT userId FROM guest WHERE attestedKey IS NOT NULL AND userId IN (\(marks))", arguments: StatementArguments(part)
            ) {
                users[userId]?.attested = true
            }
        }
        return users
    }

    /// The values of `wanted` (a counter without a row: 0), each a lookup by the table's key
    /// with one prepared statement (a row-value `IN` list would scan the table).
    static func loadUsed(_ db: Database, _ wanted: [UsageCounter]) throws -> [UsageCounter: Int] {
        var used: [UsageCounter: Int] = [:]
        for counter in wanted { used[counter] = try loadUsed(db, counter) }
        return used
    }

    /// The charges of `jobIds` the tables hold.
    static func loadCharges(_ db: Database, _ jobIds: [String]) throws -> [String: LedgerChange] {
        var charges: [String: LedgerChange] = [:]
        for part in stride(from: 0, to: jobIds.count, by: chunk).map({ Array(jobIds[$0..<min($0 + chunk, jobIds.count)]) }) {
            let marks = Array(repeating: "?", count: part.count).joined(separator: ",")
            for row in try Row.fetchAll(db, sql: "SELECT * FROM charge WHERE jobId IN (\(marks))", arguments: StatementArguments(part)) {
                if let change = chargeChange(row) { charges[change.jobId] = change }
            }
        }
        return charges
    }

    static func loadUser(_ db: Database, _ userId: String) throws -> UserEntry {
        let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT plan, timeZone, planEndsAt FROM user WHERE id = ?"), arguments: [userId])
        return UserEntry(plan: row?["plan"], timeZone: row?["timeZone"], planEndsAt: row?["planEndsAt"], attested: try loadAttested(db, userId))
    }

    static func loadAttested(_ db: Database, _ userId: String) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT attestedKey IS NOT NULL FROM guest WHERE userId = ?"), arguments: [userId]) ?? false
    }

    static func loadUsed(_ db: Database, _ counter: UsageCounter) throws -> Int {
        try Int.fetchOne(
            db.cachedStatement(sql: "SELECT used FROM usage WHERE userId = ? AND window = ? AND windowKey = ?"),
            arguments: [counter.owner, counter.window, counter.key]
        ) ?? 0
    }

    static func loadCharge(_ db: Database, _ jobId: String) throws -> LedgerChange? {
        try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM charge WHERE jobId = ?"), arguments: [jobId]).flatMap(chargeChange)
    }

    private static func chargeChange(_ row: Row) -> LedgerChange? {
        guard let state = Charge.State(rawValue: row["state"]) else { return nil }
        let reservedAt: Date = row["reservedAt"]
        let settledAt: Date? = row["settledAt"]
        return LedgerChange(
            seq: 0, jobId: row["jobId"], userId: row["userId"], cost: row["cost"], state: state, dayKey: row["dayKey"],
            monthKey: row["monthKey"], network: row["network"], reservedAt: reservedAt.timeIntervalSince1970,
            settledAt: settledAt?.timeIntervalSince1970, usage: []
        )
    }

    // MARK: Changes, and their undoing

    private mutating func record(_ change: LedgerChange) {
        var change = change
        lastSeq += 1
        change.seq = lastSeq
        undo.append(.charge(change.jobId, charges[change.jobId]))
        charges[change.jobId] = ChargeEntry(change: change)
        // Not undone by `rollBack`: an id known that the tables lack costs a read, no more.
        if knownWhole {
            known[JobKey(change.jobId)] = change.seq
            if known.count > capacity.jobIds {
                known = [:]
                knownWhole = false
            }
        }
        for usage in change.usage {
            undo.append(.counter(usage.counter, counters[usage.counter]))
            counters[usage.counter] = CounterEntry(used: usage.used, seq: change.seq)
        }
        changes.append(change)
    }

    /// The batch's changes are in the log: they stay. Hands them over and drops what the tables
    /// already hold if memory is past its capacity.
    mutating func keep(now: Date) -> [LedgerChange] {
        let kept = changes
        changes.removeAll(keepingCapacity: true)
        undo.removeAll(keepingCapacity: true)
        evictIfFull(now: now)
        return kept
    }

    /// The batch's changes could not be written: memory goes back to what it was before them.
    mutating func rollBack() {
        for step in undo.reversed() {
            switch step {
            case .counter(let counter, let entry): counters[counter] = entry
            case .charge(let jobId, let entry): charges[jobId] = entry
            }
        }
        lastSeq -= UInt64(changes.count)
        changes.removeAll(keepingCapacity: true)
        undo.removeAll(keepingCapacity: true)
    }

    /// How many changes the batch holds so far.
    var pendingChanges: Int { changes.count }

    private mutating func evictIfFull(now: Date) {
        if users.count > capacity.users {
            users.removeAll(keepingCapacity: true)
            usersWhole = false
        }
        let applied = appliedSeq
        if counters.count > sweepAbove.counters {
            // First what is not held whole; if that is not enough, nothing is held whole.
            narrowWhole(now: now)
            counters = counters.filter { $0.value.seq > applied || isWhole($0.key) }
            if counters.count > capacity.counters {
                wholeFrom = (Self.nothingWhole, Self.nothingWhole)
                counters = counters.filter { $0.value.seq > applied }
            }
            sweepAbove.counters = max(capacity.counters, counters.count + counters.count / 4)
        }
        if charges.count > sweepAbove.charges {
            charges = charges.filter { $0.value.seq > applied }
            sweepAbove.charges = max(capacity.charges, charges.count + charges.count / 4)
        }
    }

    // MARK: A user's windows

    private mutating func context(_ userId: String, now: Date) throws -> QuotaLedger.UserContext {
        try Self.context(userId, entry: try user(userId), now: now, ledger: ledger) { try used($0) }
    }

    /// A user's status when memory holds everything it reads, without reading the tables or
    /// changing memory (so a caller may ask from its own thread while no batch runs); nil when
    /// a read is needed.
    func heldStatus(userId: String, now: Date) throws -> QuotaStatus? {
        try ledger.validate(user: userId)
        guard holds(Need(userId: userId, now: now)), let entry = knownUser(userId) else { return nil }
        return try Self.context(userId, entry: entry, now: now, ledger: ledger) { counter in
            guard let used = knownUsed(counter) else { throw BusError(.internal, "a counter memory holds was not found") }
            return used
        }.status()
    }

    private static func context(
        _ userId: String, entry: UserEntry, now: Date, ledger: QuotaLedger, used: (UsageCounter) throws -> Int
    ) throws -> QuotaLedger.UserContext {
        // A plan with an end is the default plan from that instant on, whether or not anyone
        // said so: an expiry event that never comes changes nothing.
        var planName = entry.plan
        var planEndsAt = entry.planEndsAt
        if let end = planEndsAt, now >= end {
            planName = nil
            planEndsAt = nil
        }
        let (day, month) = ledger.windows.windows(containing: now, timeZone: entry.timeZone)
        return QuotaLedger.UserContext(
            userId: userId, plan: ledger.plans.effectivePlan(planName), planEndsAt: planEndsAt, timeZone: entry.timeZone,
            day: day, month: month, dailyUsed: try used(counter(userId, day)), monthlyUsed: try used(counter(userId, month))
        )
    }

    static func counter(_ owner: String, _ window: CalendarWindow) -> UsageCounter {
        UsageCounter(owner: owner, window: window.kind.rawValue, key: window.key)
    }

    /// `instant` to the millisecond, as the tables store it.
    static func millisecond(_ instant: Date) -> Double {
        (instant.timeIntervalSince1970 * 1000).rounded() / 1000
    }
}

/// A job id as `QuotaMemory.known` keeps it: a lowercase UUID, as the gateway makes them, in 16
/// bytes; anything else as its text.
struct JobKey: Hashable {
    private enum Value: Hashable {
        case uuid(UInt64, UInt64)
        case text(String)
    }

    private let value: Value

    init(_ id: String) {
        value = Self.uuid(id).map { .uuid($0.0, $0.1) } ?? .text(id)
    }

    /// The two halves of a lowercase hyphenated UUID; nil for any other text (an uppercase UUID
    /// is another job id, so it is kept as text).
    private static func uuid(_ id: String) -> (UInt64, UInt64)? {
        guard id.utf8.count == 36 else { return nil }
        var id = id
        return id.withUTF8 { bytes -> (UInt64, UInt64)? in
            var halves: (UInt64, UInt64) = (0, 0)
            var digits = 0
            for index in 0..<36 {
                let byte = bytes[index]
                if index == 8 || index == 13 || index == 18 || index == 23 {
                    guard byte == UInt8(ascii: "-") else { return nil }
                    continue
                }
                let nibble: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = byte - UInt8(ascii: "a") + 10
                default: return nil
                }
                if digits < 16 { halves.0 = halves.0 << 4 | UInt64(nibble) } else { halves.1 = halves.1 << 4 | UInt64(nibble) }
                digits += 1
            }
            return halves
        }
    }
}
