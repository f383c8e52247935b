import Foundation

/// Runs blocking work (sockets, a database writer, libvips) on a dedicated, named thread, never on
/// Swift's cooperative pool.
public enum IOThread {
    /// Starts `body` on a new thread named `name` (at most 15 bytes show in `top -H` and perf)
    /// and returns at once.
    public static func start(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread {
            // Set from the thread itself, so `top -H` and perf show which loop is which.
            Thread.current.name = name
            body()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Runs `body` on a new thread and suspends (without blocking a pool thread) until it ends.
    public static func run<T: Sendable>(name: String, _ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            start(name: name) { continuation.resume(returning: body()) }
        }
    }
}
