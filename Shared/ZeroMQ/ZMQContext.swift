import Clibzmq

/// A libzmq context (`zmq_ctx_new`). Thread-safe; sockets keep their context alive.
public final class ZMQContext: @unchecked Sendable {
    // zmq contexts are thread-safe by libzmq's contract, hence @unchecked Sendable.
    let handle: UnsafeMutableRawPointer

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
