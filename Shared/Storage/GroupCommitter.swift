import Bus
import Foundation
import GRDB
import Messages
import Synchronization
import Threads
import Tracing

/// Runs concurrent writes together: everything submitted while a transaction is being written
/// and synced goes into the next one, so one fsync answers many requests (group commit).
///
/// The transactions run on the committer's `BatchThread` (never the cooperative pool), which
/// takes everything queued each time it wakes; each caller is resumed once its transaction is
/// durable: a caller hears its answer only after the batch is committed, so an answer always
/// describes durable state. Its owner (the store that makes it) calls `close()` when it stops.
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

    /// A piece of work: `run` does it in the batch's transaction and answers how to resume its
    /// caller with what it produced (called once the transaction is durable), so each caller
    /// gets its own type back; `fail` answers it with an error instead.
    private struct Pending: Sendable {
        var run: @Sendable (Database) throws -> @Sendable () -> Void
        var fail: @Sendable (any Error) -> Void
        /// The caller's trace (`traceparent`), or empty: the batch's span links to each.
        var traceParent: String
    }

    private let writer: any DatabaseWriter
    private final class Counters: Sendable {
        let state = Mutex(Statistics())
    }

    private let counters = Counters()
    private let thread: BatchThread<Pending>

    /// Batches writes to `writer`, at most `maxBatch` pieces of work a transaction and `maxQueued`
    /// waiting (past it, `perform` fails at once with `overloaded`).
    public init(writer: any DatabaseWriter, maxBatch: Int = 1024, maxQueued: Int = 65_536) {
        self.writer = writer
        let counters = self.counters
        thread = BatchThread(name: "group-commit", maxBatch: maxBatch, maxQueued: maxQueued) { batch in
            Self.commit(batch, to: writer, counters: counters)
        }
    }

    public var statistics: Statistics { counters.state.withLock { $0 } }

    /// Runs `work` in the next batch's transaction and returns once that transaction is durable.
    public func perform<T: Sendable>(_ work: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let traceParent = BusTracing.currentTraceParent()
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let pending = Pending(
                run: { db in
                    let value = try work(db)
                    return { continuation.resume(returning: value) }
                },
                fail: { continuation.resume(throwing: $0) },
                traceParent: traceParent
            )
            switch thread.submit(pending) {
            case nil: counters.state.withLock { $0.accepted += 1 }
            case .full?: continuation.resume(throwing: BusError(.overloaded, "\(thread.maxQueued) writes already waiting"))
            case .closed?: continuation.resume(throwing: BusError(.unavailable, "the database is closing"))
            }
        }
    }

    /// Refuses new work, and returns once everything accepted is committed and answered.
    public func close() async { await thread.close() }

    private static func commit(_ batch: [Pending], to writer: any DatabaseWriter, counters: Counters) {
        // One span a traced batch, linked to the requests it carries (a transaction serves them
        // all, so it is no one's child).
        let span = BusTracing.linkedSpan("sqlite.group-commit", linking: batch.map(\.traceParent), attributes: [
            "db.system": "sqlite", "photoedit.batch.size": "\(batch.count)",
        ])
        let (outcomes, retried) = write(batch.map(\.run), to: writer)
        span?.end()
        counters.state.withLock { statistics in
            statistics.transactions += retried ? 2 : 1
            statistics.works += batch.count
            if retried { statistics.savepointRetries += 1 }
        }
        for (item, outcome) in zip(batch, outcomes) {
            switch outcome {
            case .success(let resume): resume()
            case .failure(let error): item.fail(error)
            }
        }
    }

    private struct NeedsSavepoints: Error {}

    private typealias Work = @Sendable (Database) throws -> @Sendable () -> Void
    private typealias Outcome = Result<@Sendable () -> Void, any Error>

    /// Runs `works` in one transaction; their outcomes, and whether it took a second transaction
    /// with savepoints.
    private static func write(_ works: [Work], to writer: any DatabaseWriter) -> ([Outcome], Bool) {
        do {
            let outcomes = try writer.write { db -> [Outcome] in
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
            return (outcomes, false)
        } catch is NeedsSavepoints {
            return (writeWithSavepoints(works, to: writer), true)
        } catch {
            // The transaction itself failed: nothing in the batch was written.
            return (works.map { _ in .failure(error) }, false)
        }
    }

    private static func writeWithSavepoints(_ works: [Work], to writer: any DatabaseWriter) -> [Outcome] {
        do {
            return try writer.write { db in
                works.map { work in
                    var outcome: Outcome = .failure(CancellationError())
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
