import Clibzmq

/// An error number reported by libzmq (`zmq_errno`), with its `zmq_strerror` text.
public struct ZMQError: Error, RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32

    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// The error libzmq reports for the last failed call on this thread (`zmq_errno`).
    static var current: ZMQError { ZMQError(rawValue: zmq_errno()) }

    /// The operation would block (`EAGAIN`): nothing to receive, or a high-water mark reached.
    public static let wouldBlock = ZMQError(rawValue: EAGAIN)
    /// A signal interrupted the call (`EINTR`).
    public static let interrupted = ZMQError(rawValue: EINTR)
    /// The context was terminated (`ETERM`).
    public static let terminated = ZMQError(rawValue: ETERM)
    /// A ROUTER with `ZMQ_ROUTER_MANDATORY` has no peer of that identity (`EHOSTUNREACH`).
    public static let hostUnreachable = ZMQError(rawValue: EHOSTUNREACH)
    /// An argument was invalid, such as a malformed endpoint (`EINVAL`).
    public static let invalidArgument = ZMQError(rawValue: EINVAL)

    /// The text `zmq_strerror` gives for this error number.
    public var description: String {
        guard let text = zmq_strerror(rawValue) else { return "zmq error \(rawValue)" }
        return String(cString: text) + " (\(rawValue))"
    }
}

/// Turns a libzmq return code into a `Result`: negative means failure with `zmq_errno`.
@inline(__always)
func zmqCheck(_ rc: Int32) -> Result<Int32, ZMQError> {
    rc < 0 ? .failure(.current) : .success(rc)
}

/// Throws the current libzmq error when `rc` is negative.
@inline(__always)
func zmqTry(_ rc: Int32) throws(ZMQError) {
    if rc < 0 { throw ZMQError.current }
}
