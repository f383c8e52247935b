import Clibzmq
import Foundation
import Synchronization

/// A libzmq context (`zmq_ctx_new`). Thread-safe; sockets keep their context alive.
public final class ZMQContext: @unchecked Sendable {
    // zmq contexts are thread-safe by libzmq's contract, hence @unchecked Sendable.
    let handle: UnsafeMutableRawPointer
    /// Set once `terminate(within:)` has taken the context down, so `deinit` does not again.
    private let terminated = Atomic<Bool>(false)

    /// The process-wide context that bus endpoints share unless given their own.
    public static let shared = ZMQContext()

    /// Creates a context (`zmq_ctx_new`), with `ioThreads` background I/O threads (`ZMQ_IO_THREADS`).
    public init(ioThreads: Int32 = 1) {
        guard let handle = zmq_ctx_new() else {
            fatalError("zmq_ctx_new failed: \(ZMQError.current)")
        }
        self.handle = handle
        _ = zmq_ctx_set(handle, ZMQ_IO_THREADS, ioThreads)
        // Sockets are bounded by the bus itself; raise libzmq's own cap a little for many callers.
        _ = zmq_ctx_set(handle, ZMQ_MAX_SOCKETS, 4096)
    }

    deinit {
        // Every socket holds a strong reference to its context, so none is open here and
        // zmq_ctx_term cannot block on one.
        if !terminated.load(ordering: .acquiring) { Self.term(handle) }
    }

    /// Terminates the context (`zmq_ctx_term`) as a process exits: libzmq then sends what closed
    /// sockets still hold (a service's last replies, within their linger) instead of dropping it
    /// with the process. Waits at most `limit`, since a socket left open would block the call for
    /// good; true if it finished. No socket can be opened in the context afterwards.
    @discardableResult
    public func terminate(within limit: Duration) async -> Bool {
        guard terminated.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return true }
        let (outcome, report) = AsyncStream.makeStream(of: Bool.self, bufferingPolicy: .bufferingNewest(2))
        let context = TerminatingHandle(pointer: handle)
        // zmq_ctx_term blocks: on a thread of its own, never on the cooperative pool (nor a
        // Dispatch worker). Awaited here for at most `limit`; past it the process is ending
        // with a socket open, and the thread ends with it.
        let thread = Thread {
            Self.term(context.pointer)
            report.yield(true)
        }
        thread.name = "zmq-term"
        thread.start()
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                for await finished in outcome { return finished }
                return false
            }
            group.addTask {
                try? await Task.sleep(for: limit)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    private static func term(_ handle: UnsafeMutableRawPointer) {
        while zmq_ctx_term(handle) != 0 && zmq_errno() == EINTR {}
    }

    /// The version of the libzmq that is linked (`zmq_version`).
    public static var libraryVersion: (major: Int32, minor: Int32, patch: Int32) {
        var major: Int32 = 0, minor: Int32 = 0, patch: Int32 = 0
        zmq_version(&major, &minor, &patch)
        return (major, minor, patch)
    }

    /// Whether libzmq was built with CURVE security (`zmq_has("curve")`).
    public static var hasCurve: Bool { zmq_has("curve") != 0 }
}

/// A context's handle handed to the thread that terminates it (libzmq allows that from any thread).
private struct TerminatingHandle: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer
}
