import Foundation
import Threads

/// The worker's threads for blocking work (libvips calls, file copies), off the cooperative pool:
/// as many as the machine has cores by default (`BlockingThreads`, started as calls find them
/// busy, each ended after a minute idle so that libvips keeps its thread-local caches under
/// steady work). Work beyond them waits in a bounded queue; past `maxQueued` waiting, `run` fails
/// at once. A thread per call, as before, let a worker with a high capacity start more libvips
/// calls than cores, each with its own thread start-up and libvips thread-local caches.
public final class BlockingPool: Sendable {
    /// The pool the worker's effects share.
    public static let shared = BlockingPool(threads: ProcessInfo.processInfo.activeProcessorCount)

    /// The queue is full.
    public struct Overloaded: Error, CustomStringConvertible {
        public var description: String { "too much blocking work is waiting" }
    }

    private let pool: BlockingThreads

    public var threads: Int { pool.threads }
    public var maxQueued: Int { pool.maxQueued }

    public init(threads: Int, maxQueued: Int = 4096) {
        pool = BlockingThreads(name: "blocking", threads: threads, maxQueued: maxQueued, idleTimeout: .seconds(60))
    }

    /// Calls waiting for a thread.
    public var waiting: Int { pool.waiting }

    /// Runs `work` on one of the pool's threads and returns its result.
    public func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        do {
            return try await pool.run(work)
        } catch is BlockingThreads.Refusal {
            // Never closed: the only refusal is a full queue.
            throw Overloaded()
        }
    }
}
