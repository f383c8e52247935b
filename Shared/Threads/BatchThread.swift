import Dispatch
import Foundation
import Synchronization

/// A bounded queue served in batches by one thread of its own, never the cooperative pool: the
/// one loop behind the group committer (`GroupCommitter`) and the quota ledger (`QuotaEngine`).
///
/// Each time the thread wakes it takes everything queued (up to `maxBatch`) and hands it to
/// `handle`, which answers each item (items carry their own continuations). The thread starts with
/// the first item and ends after `idleTimeout` without work, so an idle process holds no thread;
/// the next item starts it again.
///
/// Its owner is the object that makes it (a store, the ledger): that object's `close()` calls
/// `close()` here, which refuses new items, lets the thread answer what is queued and returns once
/// the thread has ended. A service's main closes its store after its service group has stopped.
public final class BatchThread<Item: Sendable>: Sendable {
    /// Why an item was not queued.
    public enum Refusal: Error, Sendable {
        /// `maxQueued` items are already waiting.
        case full
        /// `close()` was called.
        case closed
    }

    private enum Next { case start, wake, none }

    private struct State {
        var pending: [Item] = []
        var running = false
        var closed = false
        var batches = 0
        /// `close()` callers waiting for the thread to end.
        var ended: [CheckedContinuation<Void, Never>] = []
    }

    /// The thread's name (at most 15 bytes show in `top -H` and perf).
    public let name: String
    public let maxBatch: Int
    public let maxQueued: Int
    private let idleTimeout: Double
    private let handle: @Sendable ([Item]) -> Void
    private let state = Mutex(State())
    private let workArrived = DispatchSemaphore(value: 0)

    public init(name: String, maxBatch: Int, maxQueued: Int, idleTimeout: Duration = .seconds(1), handle: @escaping @Sendable ([Item]) -> Void) {
        self.name = name
        self.maxBatch = max(1, maxBatch)
        self.maxQueued = max(1, maxQueued)
        self.idleTimeout = Double(idleTimeout.components.seconds) + Double(idleTimeout.components.attoseconds) / 1e18
        self.handle = handle
    }

    /// Batches handled (or being handled) so far.
    public var batches: Int { state.withLock { $0.batches } }

    /// Whether the thread is running now.
    public var isRunning: Bool { state.withLock { $0.running } }

    /// Queues `item` for the next batch, starting the thread if it is not running; the refusal
    /// if it was not queued (the caller answers its item itself then).
    public func submit(_ item: Item) -> Refusal? {
        let next = state.withLock { state -> Result<Next, Refusal> in
            guard !state.closed else { return .failure(.closed) }
            guard state.pending.count < maxQueued else { return .failure(.full) }
            state.pending.append(item)
            if !state.running {
                state.running = true
                return .success(.start)
            }
            return .success(state.pending.count == 1 ? .wake : .none)
        }
        switch next {
        case .failure(let refusal): return refusal
        case .success(.start): IOThread.start(name: name) { [self] in loop() }
        case .success(.wake): workArrived.signal()
        case .success(.none): break
        }
        return nil
    }

    /// Refuses new items, and returns once everything queued has been handled and the thread has
    /// ended. Calling it again waits for the same end.
    public func close() async {
        await withCheckedContinuation { continuation in
            let running = state.withLock { state -> Bool in
                state.closed = true
                if state.running { state.ended.append(continuation) }
                return state.running
            }
            if running { workArrived.signal() } else { continuation.resume() }
        }
    }

    private func loop() {
        while true {
            let batch = state.withLock { state -> [Item] in
                let batch = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(batch.count)
                return batch
            }
            if !batch.isEmpty {
                // Counted first, so a caller answered by this batch sees it counted.
                state.withLock { $0.batches += 1 }
                handle(batch)
                continue
            }
            // Idle: end at once when closed, else after waiting a little for more.
            let closed = state.withLock { $0.closed }
            if closed || workArrived.wait(timeout: .now() + idleTimeout) == .timedOut {
                let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>]? in
                    guard state.pending.isEmpty else { return nil }
                    state.running = false
                    defer { state.ended = [] }
                    return state.ended
                }
                if let waiters {
                    for waiter in waiters { waiter.resume() }
                    return
                }
            }
        }
    }
}
