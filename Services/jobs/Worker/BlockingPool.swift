import Bus
import Dispatch
import Foundation
import Synchronization
import Threads

/// A fixed set of threads for blocking work (libvips calls, file copies), off the cooperative
/// pool: as many threads as the machine has cores by default, started on first use and kept.
/// Work beyond them waits in a bounded queue; past `maxQueued` waiting, `run` fails at once.
/// A thread per call, as before, let a worker with a high capacity start more libvips calls
/// than cores, each with its own thread start-up and libvips thread-local caches.
public final class BlockingPool: Sendable {
    /// The pool the worker's effects share.
    public static let shared = BlockingPool(threads: ProcessInfo.processInfo.activeProcessorCount)

    /// The queue is full.
    public struct Overloaded: Error, CustomStringConvertible {
        public var description: String { "too much blocking work is waiting" }
    }

    private struct State {
        var queue: [@Sendable () -> Void] = []
        var head = 0
        var started = false
    }

    public let threads: Int
    public let maxQueued: Int
    private let state = Mutex(State())
    private let available = DispatchSemaphore(value: 0)

    public init(threads: Int, maxQueued: Int = 4096) {
        self.threads = max(1, threads)
        self.maxQueued = maxQueued
    }

    /// Calls waiting for a thread.
    public var waiting: Int { state.withLock { $0.queue.count - $0.head } }

    /// Runs `work` on one of the pool's threads and returns its result.
    public func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let item: @Sendable () -> Void = {
                do { continuation.resume(returning: try work()) } catch { continuation.resume(throwing: error) }
            }
            let (accepted, start) = state.withLock { state -> (Bool, Bool) in
                guard state.queue.count - state.head < maxQueued else { return (false, false) }
                state.queue.append(item)
                defer { state.started = true }
                return (true, !state.started)
            }
            guard accepted else {
                continuation.resume(throwing: Overloaded())
                return
            }
            if start {
                for index in 0..<threads {
                    IOThread.start(name: "blocking-\(index)") { [self] in loop() }
                }
            }
            available.signal()
        }
    }

    private func loop() {
        while true {
            available.wait()
            let item = state.withLock { state -> (@Sendable () -> Void)? in
                guard state.head < state.queue.count else { return nil }
                let item = state.queue[state.head]
                state.head += 1
                if state.head > 1024, state.head * 2 > state.queue.count {
                    state.queue.removeFirst(state.head)
                    state.head = 0
                }
                return item
            }
            item?()
        }
    }
}
