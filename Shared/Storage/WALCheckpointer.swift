import Bus
import Foundation
import GRDB
import Synchronization
import Threads

/// Checkpoints a WAL database from a connection and thread of its own, so that copying the log
/// back into the database file (and its fsync) does not run inside a writer's commit, where
/// SQLite's automatic checkpoint puts it: under load that is a third of a group-committing
/// writer's time. The writer keeps an automatic checkpoint at a much larger log
/// (`safetyPages`) in case this one falls behind, so the log stays bounded either way.
///
/// A PASSIVE checkpoint every `interval` copies what no reader still needs and never blocks
/// the writer. `start` begins it; its owner (the service's database) ends it with `close()`,
/// which returns once the thread has ended. (Released without `close()`, as by a test, the
/// thread ends within an interval.)
public final class WALCheckpointer: Sendable {
    /// The writer's automatic checkpoint, in pages, while this one runs.
    public static let safetyPages = 16_384

    private final class Control: Sendable {
        let stop = Atomic<Bool>(false)
        let checkpoints = Atomic<Int>(0)
        /// Resumed by the thread as it ends, for `close()`.
        let ended = Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

        func finish() {
            let waiters = ended.withLock { state in
                state.done = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    private let control = Control()

    private init() {}

    /// Starts checkpointing the database at `path` every `interval`; throws if it cannot be opened.
    public static func start(path: String, interval: Duration = .milliseconds(100)) throws -> WALCheckpointer {
        var configuration = Configuration()
        configuration.busyMode = .timeout(1)
        configuration.label = "checkpointer"
        let connection = try DatabaseQueue(path: path, configuration: configuration)
        let checkpointer = WALCheckpointer()
        let control = checkpointer.control
        let pause = Double(interval.components.seconds) + Double(interval.components.attoseconds) / 1e18
        IOThread.start(name: "wal-checkpoint") {
            while !control.stop.load(ordering: .relaxed) {
                Thread.sleep(forTimeInterval: pause)
                // Busy (another checkpoint, or a reader at the start of the log): next time.
                if (try? connection.writeWithoutTransaction({ try $0.checkpoint(.passive) })) != nil {
                    control.checkpoints.add(1, ordering: .relaxed)
                }
            }
            control.finish()
        }
        return checkpointer
    }

    /// Checkpoints run so far.
    public var checkpoints: Int { control.checkpoints.load(ordering: .relaxed) }

    /// Stops the checkpoints and returns once the thread has ended (within an interval).
    public func close() async {
        control.stop.store(true, ordering: .relaxed)
        await withCheckedContinuation { continuation in
            let done = control.ended.withLock { state -> Bool in
                if !state.done { state.waiters.append(continuation) }
                return state.done
            }
            if done { continuation.resume() }
        }
    }

    deinit { control.stop.store(true, ordering: .relaxed) }
}
