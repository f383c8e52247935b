import Foundation
import Logging
import Messages
import Metrics
import Synchronization
import Threads
import ZeroMQ

/// Callers known by key: the process's ZAP handler (ZeroMQ's authentication protocol, RFC 27),
/// answering libzmq for every CURVE connection to a socket of this process. A connection whose
/// client public key is in the allow-list is admitted with its role as the ZAP user id (which
/// each message then carries, so the router can check the method's roles); any other key gets no
/// connection. On the `workers` domain (jobs' worker endpoint) only `worker` keys are admitted.
/// A refused key is logged once, then counted (`bus_callers_refused_total{domain}`).
///
/// One handler per process (libzmq asks `inproc://zeromq.zap.01` of the context), started once
/// with `install`; the allow-list may hold a caller's old and new keys at once (rotation).
public final class BusAuthentication: Sendable {
    /// The domain of the services' request sockets, and of jobs' worker endpoint.
    public static let busDomain = "bus"
    public static let workersDomain = "workers"

    private let callers: [[UInt8]: BusRole]
    private let logger: Logger
    private let refusedKeys = Mutex<Set<[UInt8]>>([])

    private static let installed = Mutex<BusAuthentication?>(nil)

    init(callers: [[UInt8]: BusRole], logger: Logger) {
        self.callers = callers
        self.logger = logger
    }

    /// Starts the process's handler with `callers` (public key to role); a second call changes
    /// nothing. Returns once the handler is bound (waiting without holding a thread of the pool),
    /// so sockets bound after it are checked.
    public static func install(callers: [[UInt8]: BusRole], logger: Logger) async throws {
        let handler = BusAuthentication(callers: callers, logger: logger)
        let started: Bool = installed.withLock { current in
            guard current == nil else { return false }
            current = handler
            return true
        }
        guard started else { return }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            IOThread.start(name: "bus-zap") {
                let socket: ZMQSocket
                do throws(ZMQError) {
                    socket = try ZMQSocket(.rep)
                    try socket.setLinger(milliseconds: 0)
                    try socket.bind("inproc://zeromq.zap.01")
                } catch {
                    continuation.resume(throwing: error)
                    return
                }
                continuation.resume()
                handler.serve(socket)
            }
        }
    }

    /// Answers ZAP requests until the context ends.
    private func serve(_ socket: ZMQSocket) {
        while true {
            let received: ZMQSocket.ReceivedMessage?
            do {
                received = try socket.receive(wait: true, maxFrames: 10)
            } catch {
                // The context is terminating (the process ends): stop.
                socket.close()
                return
            }
            guard case .frames(let frames) = received, frames.count >= 6 else { continue }
            let reply = answer(frames)
            try? socket.send(reply, wait: true)
        }
    }

    /// The reply to one ZAP request: `[version, request id, status code, status text, user id,
    /// metadata]`.
    func answer(_ frames: [[UInt8]]) -> [[UInt8]] {
        let version = frames[0], requestId = frames[1]
        let domain = String(decoding: frames[2], as: UTF8.self)
        let mechanism = String(decoding: frames[5], as: UTF8.self)
        func reply(_ code: String, _ text: String, _ user: String = "") -> [[UInt8]] {
            [version, requestId, Array(code.utf8), Array(text.utf8), Array(user.utf8), []]
        }
        guard mechanism == "CURVE", frames.count >= 7, frames[6].count == 32 else {
            return reply("400", "only CURVE callers with a known key are admitted")
        }
        let key = frames[6]
        guard let role = callers[key], domain != Self.workersDomain || role == .worker else {
            Counter(label: "bus_callers_refused_total", dimensions: [("domain", domain.isEmpty ? "none" : domain)]).increment()
            if refusedKeys.withLock({ $0.count < 10_000 && $0.insert(key).inserted }) {
                logger.warning("refused a bus caller with an unknown key", metadata: [
                    "key": "\(ZMQCurveKeyPair.encode(key))", "domain": "\(domain)",
                ])
            }
            return reply("400", "unknown key")
        }
        return reply("200", "OK", role.rawValue)
    }
}
