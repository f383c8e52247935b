import Bus
import Dispatch
import Foundation
import GRDB
import Logging
import Messages
import Metrics
import Storage
import Synchronization
import Threads

/// Writes the ledger's durable changes into the quota tables (`charge`, `usage`) in the
/// background, on a thread of its own: everything that arrived since the last checkpoint in one
/// transaction, each row written once with its latest value, and the last sequence number applied
/// recorded with them (`ledger_state`). Then the log's segments it covered are deleted.
///
/// The tables are what memory reads on a miss and what a restart starts from, so the ledger's
/// thread waits (`waitForRoom`) when more than `maxBacklog` changes are not yet applied: memory
/// and the log stay bounded even if the disk is slow. A checkpoint that fails (a full disk) keeps
/// its changes and is tried again.
final class LedgerCheckpointer: Sendable {
    private struct State {
        var pending: [LedgerChange] = []
        var applied: UInt64
        var threadRunning = false
        var waiters: [Waiter] = []
        var checkpoints = 0
        var lastFailure: String?
        /// Held back (tests: a process stopped before its checkpoints ran).
        var paused = false
    }

    private struct Waiter {
        var seq: UInt64
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private let writer: any DatabaseWriter
    private let log: LedgerLog?
    private let logger: Logger
    private let state: Mutex<State>
    /// Signalled by a flush or a resume, which want a checkpoint now; changes arriving do not
    /// (they wait for the next one, so that each checkpoint carries many batches).
    private let hurry = DispatchSemaphore(value: 0)
    private let room = DispatchSemaphore(value: 0)
    private let maxBacklog: Int
    private let maxChunk = 50_000
    private let gather: Double
    /// `quota_ledger_backlog`: changes not yet in the tables.
    private static let backlogGauge = Gauge(label: "quota_ledger_backlog")

    /// `gather`: how long a checkpoint waits for more batches. A second: the rows of random users
    /// and job ids share pages, and a page changed by many records of one checkpoint is written
    /// once (`make bench-quota`, 20 s: 15,466 decisions/s gathering 100 ms, 18,228 gathering 1 s).
    /// The tables then trail the log by about a second, which the log's tail covers at a restart.
    init(writer: any DatabaseWriter, log: LedgerLog?, applied: UInt64, logger: Logger,
         maxBacklog: Int = 500_000, gather: Duration = .seconds(1)) {
        self.writer = writer
        self.log = log
        self.logger = logger
        self.maxBacklog = maxBacklog
        self.gather = Double(gather.components.seconds) + Double(gather.components.attoseconds) / 1e18
        state = Mutex(State(applied: applied))
        Self.backlogGauge.record(0)
    }

    /// The last sequence number the tables hold.
    var appliedSeq: UInt64 { state.withLock { $0.applied } }

    /// Changes waiting to be applied, and checkpoints made (for tests and metrics).
    var backlog: Int { state.withLock { $0.pending.count } }
    var checkpoints: Int { state.withLock { $0.checkpoints } }

    /// Holds checkpoints back until `resume()` (for tests).
    func pause() { state.withLock { $0.paused = true } }
    func resume() {
        state.withLock { $0.paused = false }
        start(hurrying: true)
    }

    /// Takes a batch's durable changes (in sequence order, from the ledger's thread only).
    func submit(_ changes: [LedgerChange]) {
        guard !changes.isEmpty else { return }
        Self.backlogGauge.record(state.withLock { state in
            state.pending += changes
            return state.pending.count
        })
        start(hurrying: false)
    }

    /// Starts the thread if it is not running; with `hurrying`, wakes it for a checkpoint now.
    private func start(hurrying: Bool) {
        let start = state.withLock { state -> Bool in
            defer { state.threadRunning = true }
            return !state.threadRunning
        }
        if start { IOThread.start(name: "quota-checkpt") { [self] in loop() } } else if hurrying { hurry.signal() }
    }

    /// Blocks the ledger's thread while the backlog is full.
    func waitForRoom() {
        while state.withLock({ $0.pending.count >= maxBacklog }) {
            _ = room.wait(timeout: .now() + 0.1)
        }
    }

    /// Returns once the tables hold every change up to `seq`; fails after `timeout` (checkpoints
    /// failing, say on a full disk).
    func flush(through seq: UInt64, timeout: Duration = .seconds(10)) async throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let done = state.withLock { state -> Bool in
                if state.applied >= seq { return true }
                state.waiters.append(Waiter(seq: seq, deadline: deadline, continuation: continuation))
                return false
            }
            if done { continuation.resume() } else { start(hurrying: true) }
        }
    }

    private func loop() {
        while true {
            // Let a checkpoint gather the batches of the next moments, unless it is large already or
            // someone waits for it.
            if state.withLock({ $0.pending.count < maxChunk && $0.waiters.isEmpty }) { _ = hurry.wait(timeout: .now() + gather) }
            let chunk = state.withLock { state -> [LedgerChange] in state.paused ? [] : Array(state.pending.prefix(maxChunk)) }
            if chunk.isEmpty {
                expireWaiters()
                let ended = state.withLock { state -> Bool in
                    guard state.paused || state.pending.isEmpty, state.waiters.isEmpty else { return false }
                    state.threadRunning = false
                    return true
                }
                if ended { return }
                // Someone waits for changes not here yet (or checkpoints are paused): wait too,
                // rather than spin.
                _ = hurry.wait(timeout: .now() + gather)
                continue
            }
            do {
                try writer.write { db in try Self.apply(chunk, db) }
                let (applied, ready) = state.withLock { state -> (UInt64, [Waiter]) in
                    state.pending.removeFirst(chunk.count)
                    Self.backlogGauge.record(state.pending.count)
                    state.applied = chunk.last!.seq
                    state.checkpoints += 1
                    if state.lastFailure != nil { state.lastFailure = nil }
                    let ready = state.waiters.filter { $0.seq <= state.applied }
                    state.waiters.removeAll { $0.seq <= state.applied }
                    return (state.applied, ready)
                }
                for waiter in ready { waiter.continuation.resume() }
                room.signal()
                log?.removeApplied(through: applied)
            } catch {
                let first = state.withLock { state -> Bool in
                    defer { state.lastFailure = "\(error)" }
                    return state.lastFailure == nil
                }
                if first { logger.error("quota checkpoint failed; its changes are kept and tried again", metadata: ["error": "\(error)"]) }
                expireWaiters()
                Thread.sleep(forTimeInterval: 0.2)
            }
        }
    }

    private func expireWaiters() {
        let now = ContinuousClock.now
        let expired = state.withLock { state -> [Waiter] in
            let expired = state.waiters.filter { $0.deadline <= now }
            state.waiters.removeAll { $0.deadline <= now }
            return expired
        }
        for waiter in expired {
            waiter.continuation.resume(throwing: BusError(.storageUnavailable, "the quota tables are behind the ledger (checkpoints failing)"))
        }
    }

    /// Writes `changes` into the tables: each charge row and usage counter once, with its last
    /// value, and the last sequence number. Idempotent: the values are absolute.
    static func apply(_ changes: [LedgerChange], _ db: Database) throws {
        guard let last = changes.last else { return }
        var charges: [String: LedgerChange] = [:]
        var counters: [UsageCounter: Int] = [:]
        for change in changes {
            charges[change.jobId] = change
            for usage in change.usage { counters[usage.counter] = usage.used }
        }
        let chargeRow = try db.cachedStatement(sql: """
            INSERT INTO charge (jobId, userId, cost, state, dayKey, monthKey, reservedAt, settledAt, network)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (jobId) DO UPDATE SET userId = excluded.userId, cost = excluded.cost, state = excluded.state,
                dayKey = excluded.dayKey, monthKey = excluded.monthKey, reservedAt = excluded.reservedAt,
                settledAt = excluded.settledAt, network = excluded.network
            """)
        for change in charges.values {
            try chargeRow.execute(arguments: [
                change.jobId, change.userId, change.cost, change.state.rawValue, change.dayKey, change.monthKey,
                StoredDate.text(Date(timeIntervalSince1970: change.reservedAt)),
                change.settledAt.map { StoredDate.text(Date(timeIntervalSince1970: $0)) }, change.network,
            ])
        }
        let usageRow = try db.cachedStatement(sql: """
            INSERT INTO usage (userId, window, windowKey, used) VALUES (?, ?, ?, ?)
            ON CONFLICT (userId, window, windowKey) DO UPDATE SET used = excluded.used
            """)
        for (counter, used) in counters {
            try usageRow.execute(arguments: [counter.owner, counter.window, counter.key, used])
        }
        try db.execute(sql: "UPDATE ledger_state SET appliedSeq = ? WHERE id = 1", arguments: [Int64(bitPattern: last.seq)])
    }
}
