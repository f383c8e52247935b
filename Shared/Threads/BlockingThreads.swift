import DequeModule
import Dispatch
import Foundation
import Synchronization

/// A bounded queue of blocking calls served by up to `threads` threads of its own, never the
/// cooperative pool: each call runs alone on one of them, the queue in order. A store's reads
/// (`DatabaseReads`) and a worker's libvips calls and file copies (`BlockingPool`) run on it.
///
/// A thread starts when a call finds every running thread busy, and ends after `idleTimeout`
/// without work, so an idle process holds no thread. A thread that finishes a call takes the next
/// one queued without sleeping, so a busy queue costs no wake-up per call.
///
/// Its owner is the object that makes it (a store, the worker process): a store's `close()` calls
/// `close()` here, which refuses new calls, lets the threads run what is queued and returns once
/// they have ended.
public final class BlockingThreads: Sendable {
    /// Why a call was not queued.
    public enum Refusal: Error, Sendable {
        /// `maxQueued` calls are already waiting.
        case full
        /// `close()` was called.
        case closed
    }

    private struct State {
        var pending = Deque<@Sendable () -> Void>()
        var running = 0
        /// Threads waiting for work that no `submit` has signalled yet.
        var idle = 0
        var closed = false
        /// `close()` callers waiting for the last thread to end.
        var ended: [CheckedContinuation<Void, Never>] = []
    }

    /// The threads' name (at most 15 bytes show in `top -H` and perf).
    public let name: String
    public let threads: Int
    public let maxQueued: Int
    private let idleTimeout: Double
    private let state = Mutex(State())
    private let workArrived = DispatchSemaphore(value: 0)

    public init(name: String, threads: Int, maxQueued: Int, idleTimeout: Duration = .seconds(1)) {
        self.name = name
        self.threads = max(1, threads)
        self.maxQueued = max(1, maxQueued)
        self.idleTimeout = Double(idleTimeout.components.seconds) + Double(idleTimeout.components.attoseconds) / 1e18
    }

    /// The threads running now.
    public var running: Int { state.withLock { $0.running } }

    /// The calls queued and not yet taken by a thread.
    public var waiting: Int { state.withLock { $0.pending.count } }

    /// Runs `body` on one of the threads and suspends (without blocking a pool thread) until it
    /// returns; throws `Refusal` when it was not queued.
    public func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            if let refusal = submit({ continuation.resume(with: Result { try body() }) }) {
                continuation.resume(throwing: refusal)
            }
        }
    }

    /// Queues `call`, waking an idle thread or starting one when every running thread is busy;
    /// the refusal if it was not queued.
    public func submit(_ call: @escaping @Sendable () -> Void) -> Refusal? {
        enum Next { case wake, start, none }
        let next = state.withLock { state -> Result<Next, Refusal> in
            guard !state.closed else { return .failure(.closed) }
            guard state.pending.count < maxQueued else { return .failure(.full) }
            state.pending.append(call)
            if state.idle > 0 {
                state.idle -= 1
                return .success(.wake)
            }
            if state.running < threads {
                state.running += 1
                return .success(.start)
            }
            return .success(.none)
        }
        switch next {
        case .failure(let refusal): return refusal
        case .success(.wake): workArrived.signal()
        case .success(.start): IOThread.start(name: name) { [self] in loop() }
        case .success(.none): break
        }
        return nil
    }

    /// Refuses new calls, and returns once everything queued has run and every thread has ended.
    /// Calling it again waits for the same end.
    public func close() async {
        await withCheckedContinuation { continuation in
            let wake = state.withLock { state -> Int? in
                state.closed = true
                guard state.running > 0 else { return nil }
                state.ended.append(continuation)
                // Every idle thread is woken to see the queue closed.
                defer { state.idle = 0 }
                return state.idle
            }
            guard let wake else { return continuation.resume() }
            for _ in 0..<wake { workArrived.signal() }
        }
    }

    private func loop() {
        while true {
            enum Step { case run(@Sendable () -> Void), wait, end([CheckedContinuation<Void, Never>]) }
            let step = state.withLock { state -> Step in
                if let call = state.pending.popFirst() { return .run(call) }
                if state.closed { return .end(Self.leave(&state)) }
                state.idle += 1
                return .wait
            }
            switch step {
            case .run(let call):
                call()
            case .end(let waiters):
                for waiter in waiters { waiter.resume() }
                return
            case .wait:
                guard workArrived.wait(timeout: .now() + idleTimeout) == .timedOut else { continue }
                // Timed out: end unless a `submit` or `close()` counted this thread as woken
                // (`idle` already taken back), in which case its signal is consumed first.
                let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>]? in
                    guard state.idle > 0 else { return nil }
                    state.idle -= 1
                    return Self.leave(&state)
                }
                if let waiters {
                    for waiter in waiters { waiter.resume() }
                    return
                }
                workArrived.wait()
            }
        }
    }

    /// A thread ends: the `close()` callers to resume once it was the last.
    private static func leave(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        state.running -= 1
        guard state.running == 0 else { return [] }
        defer { state.ended = [] }
        return state.ended
    }
}
