import Bus
import Foundation
import Synchronization

/// Gathers the operations that arrive while a batch is in PostgreSQL and hands them to `execute`
/// as the next batch: one transaction, and a bounded number of round trips, for many callers
/// (what the SQLite stores' group commit does on their database thread).
///
/// No task of its own: the first caller to find no batch running leads one. It runs `execute`
/// with every operation waiting (up to `maximumBatch`), answers them, and hands the lead to the
/// oldest operation that arrived meanwhile, whose caller runs the next batch. So a batch runs in
/// the task of a caller that waits for it anyway, and nothing is left running once every caller
/// has its answer. At most `lanes` batches run at once.
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
/// not make PostgreSQL stop a batch of hundreds within milliseconds. An operation whose own
/// deadline passed while it waited is answered `PostgresUnavailable` without being run (nothing
/// was done). Past `maximumWaiting` operations waiting, a caller is told the same at once.
public final class PostgresBatcher<Request: Sendable, Response: Sendable>: Sendable {
    /// Runs a batch: one answer per request, in order. Throwing answers every request with the error.
    public typealias Execute = @Sendable ([Request]) async throws -> [Result<Response, any Error>]

    public let maximumBatch: Int
    public let maximumWaiting: Int
    public let lanes: Int
    private let location: PostgresLocation
    private let execute: Execute
    private let state = Mutex(State())

    private struct State {
        var waiting: [Waiter] = []
        var running = 0
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
        var turn: CheckedContinuation<Turn, Never>
    }

    private enum Admission { case lead, wait, refused }

    private enum Turn {
        case answered(Result<Response, any Error>)
        /// Run the next batch: this waiter's request first.
        case lead
    }

    public init(
        location: PostgresLocation, maximumBatch: Int = 256, maximumWaiting: Int = PostgresPool.maximumOperations, lanes: Int = 1,
        execute: @escaping Execute
    ) {
        precondition(maximumBatch > 0 && lanes > 0)
        self.location = location
        self.maximumBatch = maximumBatch
        self.maximumWaiting = maximumWaiting
        self.lanes = lanes
        self.execute = execute
    }

    /// `request`'s answer, once the batch it joined has committed (or failed).
    public func submit(_ request: Request) async throws -> Response {
        let deadline = BusDeadline.current
        let turn = await withCheckedContinuation { (turn: CheckedContinuation<Turn, Never>) in
            let admission = state.withLock { state -> Admission in
                if state.running < lanes {
                    state.running += 1
                    return .lead
                }
                guard state.waiting.count < maximumWaiting else { return .refused }
                state.waiting.append(Waiter(request: request, deadline: deadline, turn: turn))
                return .wait
            }
            switch admission {
            case .lead: turn.resume(returning: .lead)
            case .wait: break
            case .refused: turn.resume(returning: .answered(.failure(PostgresUnavailable(location: location))))
            }
        }
        switch turn {
        case .answered(let result):
            return try result.get()
        case .lead:
            return try await lead(with: request, deadline: deadline).get()
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

    /// Runs a batch of `first` and those waiting, then hands the lead on or gives the lane back.
    private func lead(with first: Request, deadline: ContinuousClock.Instant?) async -> Result<Response, any Error> {
        let others = state.withLock { state in
            let count = min(state.waiting.count, maximumBatch - 1)
            defer { state.waiting.removeFirst(count) }
            return Array(state.waiting.prefix(count))
        }
        // An operation whose caller has stopped waiting is not run; the batch is given until the
        // earliest deadline of the others, at least `leastTime` on (`deadline(of:now:)`).
        let now = ContinuousClock.now
        let firstExpired = deadline.map { $0 <= now } ?? false
        var batch: [Request] = firstExpired ? [] : [first]
        var members: [Waiter] = []
        for waiter in others {
            if let deadline = waiter.deadline, deadline <= now {
                waiter.turn.resume(returning: .answered(.failure(PostgresUnavailable(location: location))))
            } else {
                batch.append(waiter.request)
                members.append(waiter)
            }
        }
        state.withLock { state in
            state.statistics.operations += batch.count
            state.statistics.batches += batch.isEmpty ? 0 : 1
        }
        let batchDeadline = Self.deadline(of: (firstExpired ? [] : [deadline]) + members.map(\.deadline), now: now)
        var results: [Result<Response, any Error>] = []
        if !batch.isEmpty {
            do {
                results = try await BusDeadline.$current.withValue(batchDeadline) { try await execute(batch) }
                precondition(results.count == batch.count, "a batch answers each of its requests")
            } catch {
                results = Array(repeating: .failure(error), count: batch.count)
            }
        }
        let own: Result<Response, any Error> = firstExpired ? .failure(PostgresUnavailable(location: location)) : results[0]
        for (waiter, result) in zip(members, results.dropFirst(firstExpired ? 0 : 1)) {
            waiter.turn.resume(returning: .answered(result))
        }
        let next = state.withLock { state -> Waiter? in
            guard !state.waiting.isEmpty else {
                state.running -= 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.turn.resume(returning: .lead)
        return own
    }
}
