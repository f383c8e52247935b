import Bus
import Foundation
import Synchronization

/// Gathers the operations that arrive while a batch is in PostgreSQL and hands them to `execute`
/// as the next batch: one transaction, and a bounded number of round trips, for many callers
/// (what the SQLite stores' group commit does on their database thread).
///
/// The first caller to find no batch running starts a driver: an operation of the pool
/// (`PostgresPool.launch`), owned by the pool's run (whose stop waits for it) and run on the
/// pool's event loop, the thread its connections' answers arrive on. The driver runs `execute`
/// with every operation waiting (up to `maximumBatch`), answers them, and runs the next batch at
/// once with those that arrived meanwhile, until none wait; then it ends, and nothing is left
/// running once every caller has its answer. One driver at a time: two, each starting a batch
/// beside the other's, made smaller batches that paid a batch's fixed cost more often, and no
/// more decisions a second (docs/quota.md).
///
/// The driver is not a caller's task (as it was): a caller's task runs on the bus server's
/// thread, and each batch's COMMIT went back there, queued behind the replies of the batch
/// before, before the next batch's BEGIN came back to the event loop: about 2 ms between one
/// batch's COMMIT and the next one's BEGIN in the quota service on PostgreSQL (strace), half of a
/// batch's time. On the loop, the next batch starts as soon as the last one has committed, and
/// the answers travel back to their callers meanwhile.
///
/// A batch is bounded by the earliest bus deadline of its operations (none if none has one), so
/// that each is answered before its caller gives up: a batch that waits in PostgreSQL (a lock held
/// by a replica cut off from the network, until PostgreSQL ends that session) is stopped by
/// PostgreSQL in time for the soonest of its callers, and every operation in it is answered
/// `PostgresUnavailable`, outcome unknown, which callers may send again. Bounded by the latest
/// deadline instead, the operations with earlier ones were answered after their callers had
/// given up (504s at the gateway in `make hosts-chaos`, partition-leader-host). A batch that runs
/// as usual takes milliseconds and meets every deadline either way. A batch is given at least
/// `leastTime` (1 s), so that one operation near its deadline (a call sent again late, say) does
/// not make PostgreSQL stop a batch of hundreds within milliseconds. Such an operation is still
/// answered in time: while a batch runs, a watch answers each of its operations whose time is up
/// (`Waiter.answerBy`, the answer margin before its deadline) as `PostgresOperationTimedOut` (the
/// batch may yet commit it), and each operation waiting for the next batch whose time is up as
/// `PostgresUnavailable` (nothing was done). An operation whose own deadline passed while it
/// waited is answered `PostgresUnavailable` without being run. Past `maximumWaiting` operations
/// waiting, or once the pool has stopped, a caller is told the same at once.
public final class PostgresBatcher<Request: Sendable, Response: Sendable>: Sendable {
    /// Runs a batch: one answer per request, in order. Throwing answers every request with the error.
    public typealias Execute = @Sendable ([Request]) async throws -> [Result<Response, any Error>]

    public let maximumBatch: Int
    public let maximumWaiting: Int
    private let database: PostgresPool
    private let execute: Execute
    private let state = Mutex(State())

    private struct State {
        var waiting: [Waiter] = []
        /// Whether a driver runs.
        var driving = false
        var statistics = Statistics()
    }

    /// What has been run so far.
    public struct Statistics: Sendable {
        /// Operations run in a batch.
        public var operations = 0
        /// Batches run.
        public var batches = 0
    }

    public var statistics: Statistics { state.withLock(\.statistics) }

    /// How many operations wait for the batch in PostgreSQL to end.
    public var waiting: Int { state.withLock(\.waiting.count) }

    private struct Waiter {
        var request: Request
        var deadline: ContinuousClock.Instant?
        /// When the caller is answered at the latest, whatever its batch is doing: the pool's
        /// margin for an answer before `deadline` (`PostgresPool.margin(within:)`).
        var answerBy: ContinuousClock.Instant?
        var answer: Answer<Response>

        init(request: Request, deadline: ContinuousClock.Instant?, arrived: ContinuousClock.Instant, answer: Answer<Response>) {
            self.request = request
            self.deadline = deadline
            self.answerBy = deadline.map { $0 - PostgresPool.margin(within: arrived.duration(to: $0)) }
            self.answer = answer
        }
    }

    private enum Admission { case drive, wait, refused }

    public init(
        database: PostgresPool, maximumBatch: Int = 256, maximumWaiting: Int = PostgresPool.maximumOperations, execute: @escaping Execute
    ) {
        precondition(maximumBatch > 0)
        self.database = database
        self.maximumBatch = maximumBatch
        self.maximumWaiting = maximumWaiting
        self.execute = execute
    }

    /// `request`'s answer, once the batch it joined has committed (or failed).
    public func submit(_ request: Request) async throws -> Response {
        let deadline = BusDeadline.current
        let arrived = ContinuousClock.now
        return try await withCheckedContinuation { (caller: CheckedContinuation<Result<Response, any Error>, Never>) in
            let answer = Answer(caller)
            let admission = state.withLock { state -> Admission in
                guard state.waiting.count < maximumWaiting else { return .refused }
                state.waiting.append(Waiter(request: request, deadline: deadline, arrived: arrived, answer: answer))
                guard !state.driving else { return .wait }
                state.driving = true
                return .drive
            }
            switch admission {
            case .drive: startDriver()
            case .wait: break
            case .refused: answer.give(.failure(PostgresUnavailable(location: database.location)))
            }
        }.get()
    }

    /// Starts a driver (see the type's notes); if the pool has stopped, or has as many
    /// operations as it takes, answers those waiting.
    private func startDriver() {
        let launched = database.launch({ await self.drive() }, stopped: { self.driverStopped() })
        if !launched { driverStopped() }
    }

    /// A driver that never ran (the pool has stopped, or is full): the operations waiting are told
    /// the database is unavailable (nothing was done), and the next caller starts another.
    private func driverStopped() {
        let waiters = state.withLock { state in
            state.driving = false
            defer { state.waiting.removeAll() }
            return state.waiting
        }
        for waiter in waiters { waiter.answer.give(.failure(PostgresUnavailable(location: database.location))) }
    }

    /// Runs batches of those waiting until none wait; then the next caller starts another driver.
    private func drive() async {
        while let waiters = nextBatch() {
            await run(waiters)
        }
    }

    /// The next batch's operations, nil (and the driver done) if none wait.
    private func nextBatch() -> [Waiter]? {
        state.withLock { state in
            guard !state.waiting.isEmpty else {
                state.driving = false
                return nil
            }
            let count = min(state.waiting.count, maximumBatch)
            defer { state.waiting.removeFirst(count) }
            return Array(state.waiting.prefix(count))
        }
    }

    /// The least time a batch is given, whatever its operations' deadlines: one that arrived with
    /// less left does not cut the others' batch short (were the batch to stall, that one would be
    /// answered after its caller gave up).
    static var leastTime: Duration { .seconds(1) }

    /// The deadline a batch of operations with `deadlines` runs under: the earliest (none if none
    /// has one), but at least `leastTime` from `now`.
    static func deadline(of deadlines: [ContinuousClock.Instant?], now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        deadlines.compactMap { $0 }.min().map { max($0, now.advanced(by: leastTime)) }
    }

    /// Runs one batch of `waiters` and answers each.
    private func run(_ waiters: [Waiter]) async {
        // An operation whose caller has stopped waiting is not run; the batch is given until the
        // earliest deadline of the others, at least `leastTime` on (`deadline(of:now:)`).
        let now = ContinuousClock.now
        var members: [Waiter] = []
        members.reserveCapacity(waiters.count)
        for waiter in waiters {
            if let deadline = waiter.deadline, deadline <= now {
                waiter.answer.give(.failure(PostgresUnavailable(location: database.location)))
            } else {
                members.append(waiter)
            }
        }
        guard !members.isEmpty else { return }
        state.withLock { state in
            state.statistics.operations += members.count
            state.statistics.batches += 1
        }
        let batchDeadline = Self.deadline(of: members.map(\.deadline), now: now)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [members] in await self.watch(members) }
            var results: [Result<Response, any Error>]
            do {
                results = try await BusDeadline.$current.withValue(batchDeadline) { try await execute(members.map(\.request)) }
                precondition(results.count == members.count, "a batch answers each of its requests")
            } catch {
                results = Array(repeating: .failure(error), count: members.count)
            }
            group.cancelAll()
            // (Those the watch answered already are not answered again.)
            for (waiter, result) in zip(members, results) {
                waiter.answer.give(result)
            }
        }
    }

    /// While a batch of `members` runs (until cancelled): answers each member whose time is up
    /// as timed out (the batch may still commit it), and each operation waiting for the next
    /// batch whose time is up as unavailable (taken out: nothing was done). Wakes at the next
    /// member's time, and every `PostgresPool.checkEvery` for the operations that arrive.
    private func watch(_ members: [Waiter]) async {
        let pending = members.compactMap { member in member.answerBy.map { ($0, member.answer) } }.sorted { $0.0 < $1.0 }
        var index = 0
        while true {
            let now = ContinuousClock.now
            while index < pending.count, pending[index].0 <= now {
                pending[index].1.give(.failure(PostgresOperationTimedOut()))
                index += 1
            }
            let late = state.withLock { state -> [Waiter] in
                let isLate = { (waiter: Waiter) in waiter.answerBy.map { $0 <= now } ?? false }
                let late = state.waiting.filter(isLate)
                if !late.isEmpty { state.waiting.removeAll(where: isLate) }
                return late
            }
            for waiter in late { waiter.answer.give(.failure(PostgresUnavailable(location: database.location))) }
            var wake = now.advanced(by: PostgresPool.checkEvery)
            if index < pending.count { wake = min(wake, pending[index].0) }
            guard (try? await Task.sleep(until: wake)) != nil else { return }
        }
    }
}
