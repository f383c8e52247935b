import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A TCP proxy on loopback in front of a real server, which a test can freeze: while frozen it
/// leaves new connections in its listening backlog (the kernel completes their handshakes) and
/// passes no byte either way on those it has, which is how a server whose processes were stopped
/// (SIGSTOP, a hung host) looks from the network; thawed, it passes on what waited. What
/// toxiproxy's "timeout" toxic does, for one server of the tests' own (the test PostgreSQL, which
/// every other test of the run shares and so cannot itself be stopped).
///
/// Each connection is pumped by two threads of its own (blocking reads, never on the cooperative
/// pool); `stop()` shuts every socket down and waits for them all.
final class FreezableProxy: Sendable {
    let port: Int
    private let upstream: Int
    private let listener: Int32
    private let frozen = Atomic<Bool>(false)
    private let state = Mutex<(stopped: Bool, sockets: Set<Int32>)>((false, []))
    private let threads = DispatchGroup()

    /// A proxy on `port` (a free one if nil) to 127.0.0.1:`upstream`; nil if it cannot listen.
    init?(port: Int? = nil, upstream: Int) {
        self.port = port ?? freePort()
        self.upstream = upstream
        listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        guard bindLoopback(listener, port: self.port) == 0, listen(listener, 128) == 0 else {
            close(listener)
            return nil
        }
        spawn { [self] in acceptLoop() }
    }

    func freeze() { frozen.store(true, ordering: .sequentiallyConsistent) }
    func thaw() { frozen.store(false, ordering: .sequentiallyConsistent) }

    /// Closes the listener and every connection, and waits for every thread to end.
    func stop() {
        let sockets = state.withLock { state in
            state.stopped = true
            return state.sockets
        }
        thaw()
        shutdown(listener, Int32(SHUT_RDWR))
        for fd in sockets { shutdown(fd, Int32(SHUT_RDWR)) }
        threads.wait()
        close(listener)
        for fd in sockets { close(fd) }
    }

    private var stopped: Bool { state.withLock { $0.stopped } }

    /// Waits while frozen; false once stopped.
    private func waitWhileFrozen() -> Bool {
        while frozen.load(ordering: .sequentiallyConsistent) {
            if stopped { return false }
            usleep(5_000)
        }
        return !stopped
    }

    private func spawn(_ body: @escaping @Sendable () -> Void) {
        threads.enter()
        Thread.detachNewThread { [threads] in
            body()
            threads.leave()
        }
    }

    /// Registers `fd` to be shut down at `stop()`; false (and closed) if stopped already.
    private func keep(_ fd: Int32) -> Bool {
        let kept = state.withLock { state -> Bool in
            guard !state.stopped else { return false }
            state.sockets.insert(fd)
            return true
        }
        if !kept { close(fd) }
        return kept
    }

    private func acceptLoop() {
        while waitWhileFrozen() {
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                if errno == EINTR { continue }
                return
            }
            guard keep(client) else { return }
            guard let server = try? RawConnection.connected(port: upstream) else {
                shutdown(client, Int32(SHUT_RDWR))
                continue
            }
            guard keep(server) else { return }
            spawn { [self] in pump(from: client, to: server) }
            spawn { [self] in pump(from: server, to: client) }
        }
    }

    /// Copies bytes from one socket to the other, holding them while frozen; at either end's
    /// close, shuts both down (so that the other direction's thread ends too).
    private func pump(from source: Int32, to destination: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        copying: while waitWhileFrozen() {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0, waitWhileFrozen() else { break }
            var sent = 0
            while sent < count {
                let written = buffer.withUnsafeBytes { send(destination, $0.baseAddress! + sent, count - sent, Int32(MSG_NOSIGNAL)) }
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { break copying }
                sent += written
            }
        }
        shutdown(source, Int32(SHUT_RDWR))
        shutdown(destination, Int32(SHUT_RDWR))
    }
}
