import Dispatch
import Bus
import Foundation
import GRDB
import Messages
import Synchronization
import Tracing

/// Runs concurrent writes together: everything submitted while a transaction is being written
/// and synced goes into the next one, so one fsync answers many requests (group commit).
///
/// The transactions run on a thread of the committer's own (never the cooperative pool), which
/// takes everything queued each time it wakes and resumes each caller once its transaction is
/// durable: a caller hears its answer only after the batch is committed, so an answer always
/// describes durable state. The thread ends after a second without work and starts again with
/// the next.
///
/// A piece of work that throws without having changed a row fails alone and the rest of its batch
/// goes on. One that throws after changing rows would leave half its changes in the batch: the
/// whole transaction is then rolled back and the batch run again with a savepoint around each
/// piece of work, so that one rolls back alone. Work must therefore be repeatable (it reads what
/// it needs from the database it is given).
public final class GroupCommitter: Sendable {
    /// What the committer has done, for tests and metrics.
    public struct Statistics: Sendable, Equatable {
        /// Transactions committed (or attempted).
        public var transactions = 0
        /// Pieces of work run.
        public var works = 0
        /// Pieces of work accepted (run, or waiting for their batch).
        public var accepted = 0
        /// Batches run again with a savepoint per piece of work.
        public var savepointRetries = 0
    }

    private struct Pending {
        var work: @Sendable (Database) throws -> any Sendable
        /// The caller's trace (`traceparent`), or empty: the batch's span links to each.
        var traceParent: String
        var continuation: CheckedContinuation<Result<any Sendable, any Error>, Never>
    }

    private struct State {
        var pending: [Pending] = []
        var threadRunning = false
        var statistics = Statistics()
    }

    private let writer: any DatabaseWriter
    private let maxBatch: Int
    private let maxQueued: Int
    private let state = Mutex(State())
    private let workArrived = DispatchSemaphore(value: 0)

    /// Batches writes to `writer`, at most `maxBatch` pieces of work a transaction and `maxQueued`
    /// waiting (past it, `perform` fails at once with `overloaded`).
    public init(writer: any DatabaseWriter, maxBatch: Int = 1024, maxQueued: Int = 65_536) {
        self.writer = writer
        self.maxBatch = maxBatch
        self.maxQueued = maxQueued
    }

    public var statistics: Statistics { state.withLock { $0.statistics } }

    /// Runs `work` in the next batch's transaction and returns once that transaction is durable.
    public func perform<T: Sendable>(_ work: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let traceParent = BusTracing.currentTraceParent()
        let result = await withCheckedContinuation { continuation in
            let (accepted, startThread, wake) = state.withLock { state -> (Bool, Bool, Bool) in
                guard state.pending.count < maxQueued else { return (false, false, false) }
                state.pending.append(Pending(work: { try work($0) }, traceParent: traceParent, continuation: continuation))
                state.statistics.accepted += 1
                let start = !state.threadRunning
                state.threadRunning = true
                return (true, start, !start && state.pending.count == 1)
            }
            if !accepted {
                continuation.resume(returning: .failure(BusError(.overloaded, "\(maxQueued) writes already waiting")))
            } else if startThread {
                IOThread.start(name: "group-commit") { [self] in writeLoop() }
            } else if wake {
                workArrived.signal()
            }
        }
        // The value was produced by `work`, so it is a T.
        return try result.get() as! T
    }

    private func writeLoop() {
        while true {
            let batch = state.withLock { state -> [Pending] in
                let batch = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(batch.count)
                return batch
            }
            if batch.isEmpty {
                // Idle: wait a little for more, then end the thread.
                if workArrived.wait(timeout: .now() + 1) == .timedOut {
                    let ended = state.withLock { state -> Bool in
                        if state.pending.isEmpty { state.threadRunning = false }
                        return !state.threadRunning
                    }
                    if ended { return }
                }
                continue
            }
            // One span a traced batch, linked to the requests it carries (a transaction serves them
            // all, so it is no one's child).
            let span = BusTracing.linkedSpan("sqlite.group-commit", linking: batch.map(\.traceParent), attributes: [
                "db.system": "sqlite", "photoedit.batch.size": "\(batch.count)",
            ])
            let (results, retried) = write(batch.map(\.work))
            span?.end()
            state.withLock { state in
                state.statistics.transactions += retried ? 2 : 1
                state.statistics.works += batch.count
                if retried { state.statistics.savepointRetries += 1 }
            }
            for (item, result) in zip(batch, results) {
                item.continuation.resume(returning: result)
            }
        }
    }

    private struct NeedsSavepoints: Error {}

    /// Runs `works` in one transaction; the results, and whether it took a second transaction with
    /// savepoints.
    private func write(_ works: [@Sendable (Database) throws -> any Sendable]) -> ([Result<any Sendable, any Error>], Bool) {
        do {
            let results = try writer.write { db -> [Result<any Sendable, any Error>] in
                try works.map { work in
                    let changesBefore = db.totalChangesCount
                    do {
                        return .success(try work(db))
                    } catch {
                        // Nothing written: this one fails alone, no rollback needed.
                        guard db.totalChangesCount == changesBefore else { throw NeedsSavepoints() }
                        return .failure(error)
                    }
                }
            }
            return (results, false)
        } catch is NeedsSavepoints {
            return (writeWithSavepoints(works), true)
        } catch {
            // The transaction itself failed: nothing in the batch was written.
            return (works.map { _ in .failure(error) }, false)
        }
    }

    private func writeWithSavepoints(_ works: [@Sendable (Database) throws -> any Sendable]) -> [Result<any Sendable, any Error>] {
        do {
            return try writer.write { db in
                works.map { work in
                    var outcome: Result<any Sendable, any Error> = .failure(CancellationError())
                    do {
                        try db.inSavepoint {
                            do {
                                outcome = .success(try work(db))
                                return .commit
                            } catch {
                                outcome = .failure(error)
                                return .rollback
                            }
                        }
                    } catch {
                        outcome = .failure(error)
                    }
                    return outcome
                }
            }
        } catch {
            return works.map { _ in .failure(error) }
        }
    }
}
