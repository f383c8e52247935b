import Messages
import Foundation
import GRDB
import Threads

/// A SQLite database's reads, each run whole on one of a few threads of the store's own
/// (`BlockingThreads`), with GRDB's blocking `read` (a pool's reader connection, one snapshot).
///
/// GRDB's async `read` went through its dispatch-queue actor and its reader pool's semaphore: with
/// 32 pages asked at once and 5 readers, threads blocked on the semaphore, and its hops and
/// wake-ups were a tenth of the history process serving pages (perf of `make bench-history`).
/// Here a read is one queue entry, one resumption of its caller, and no wake-up while reads keep
/// coming. The threads are at most the pool's readers, so no read waits for a connection.
public struct DatabaseReads: Sendable {
    private let reader: any DatabaseReader
    private let threads: BlockingThreads

    /// The threads a store's reads get by default: one a core, at most GRDB's default number of
    /// reader connections (5).
    public static var defaultThreads: Int { min(5, max(1, ProcessInfo.processInfo.activeProcessorCount)) }

    /// Reads of `reader` on up to `threads` threads named `name`, at most `maxQueued` waiting.
    public init(_ reader: any DatabaseReader, name: String, threads: Int = defaultThreads, maxQueued: Int = 10_000) {
        self.reader = reader
        self.threads = BlockingThreads(name: name, threads: threads, maxQueued: maxQueued)
    }

    /// `body` in a read-only transaction of its own; `overloaded` when `maxQueued` reads already
    /// wait, `unavailable` once closed.
    public func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return try await threads.run { [reader] in try reader.read(body) }
        } catch BlockingThreads.Refusal.full {
            throw BusError(.overloaded, "\(threads.maxQueued) reads already waiting")
        } catch BlockingThreads.Refusal.closed {
            throw BusError(.unavailable, "the database is closing")
        }
    }

    /// The reads queued and not yet begun.
    public var waiting: Int { threads.waiting }

    /// Refuses new reads and returns once the queued ones have run and the threads have ended.
    public func close() async { await threads.close() }
}
