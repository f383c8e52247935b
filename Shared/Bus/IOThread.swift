import Foundation

/// Runs blocking socket work on a dedicated thread, never on Swift's cooperative pool.
enum IOThread {
    /// Starts `body` on a new thread named `name` and returns at once.
    static func start(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread {
            // Set from the thread itself, so `top -H` and perf show which loop is which.
            Thread.current.name = name
            body()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Runs `body` on a new thread and suspends (without blocking a pool thread) until it ends.
    static func run<T: Sendable>(name: String, _ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            start(name: name) { continuation.resume(returning: body()) }
        }
    }
}
