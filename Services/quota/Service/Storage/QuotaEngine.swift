import Bus
import Dispatch
import Foundation
import GRDB
import Messages
import Synchronization
import Tracing

/// Runs every quota operation on one thread of its own, against `QuotaMemory`, in batches: all
/// the operations waiting when the thread wakes are decided one after the other in memory, the
/// changes they made are appended to the log with one write and made durable with one
/// `fdatasync`, and only then is anyone answered (group commit, with the state in memory: one
/// sequential append per decision instead of rows changed in three B-trees). The batch's
/// changes then go to the `LedgerCheckpointer`, which writes them into the tables in the
/// background.
///
/// Operations that change plans, subscriptions or guests are rare; they write the tables
/// directly in a transaction of their own on the same thread, then update memory.
///
/// If the log cannot be written (a full disk), the batch's changes are undone in memory and its
/// deciding operations fail (`storage_full`); the next batch tries again. If it cannot be synced,
/// nothing more is decided until the process restarts (after a failed fsync the file's state is
/// not known), and every change answers `storage_unavailable`.
final class QuotaEngine: Sendable {
    private struct Pending {
        var need: QuotaMemory.Need?
        var work: @Sendable (inout QuotaMemory) throws -> any Sendable
        var traceParent: String
        var continuation: CheckedContinuation<Result<any Sendable, any Error>, Never>
    }

    private struct Queue {
        var pending: [Pending] = []
        var threadRunning = false
    }

    private let queue = Mutex(Queue())
    private let workArrived = DispatchSemaphore(value: 0)
    private let memory: Mutex<QuotaMemory>
    private let log: LedgerLog?
    let checkpointer: LedgerCheckpointer
    /// Set when a sync failed: every later change is refused with it.
    private let broken = Mutex<BusError?>(nil)
    private let maxBatch: Int
    private let maxQueued: Int
    /// How many batches the ledger's thread has run.
    private let batchCount = Atomic<Int>(0)
    var batches: Int { batchCount.load(ordering: .relaxed) }

    init(memory: sending QuotaMemory, log: LedgerLog?, checkpointer: LedgerCheckpointer, maxBatch: Int = 4096, maxQueued: Int = 65_536) {
        self.memory = Mutex(memory)
        self.log = log
        self.checkpointer = checkpointer
        self.maxBatch = maxBatch
        self.maxQueued = maxQueued
    }

    /// Runs `work` on the ledger's thread, after loading what `need` names if memory lacks it,
    /// and returns once the changes it made (with the rest of its batch) are durable.
    func perform<T: Sendable>(_ need: QuotaMemory.Need? = nil, _ work: @escaping @Sendable (inout QuotaMemory) throws -> T) async throws -> T {
        let traceParent = BusTracing.currentTraceParent()
        let result = await withCheckedContinuation { continuation in
            let (accepted, startThread, wake) = queue.withLock { queue -> (Bool, Bool, Bool) in
                guard queue.pending.count < maxQueued else { return (false, false, false) }
                queue.pending.append(Pending(need: need, work: { try work(&$0) }, traceParent: traceParent, continuation: continuation))
                let start = !queue.threadRunning
                queue.threadRunning = true
                return (true, start, !start && queue.pending.count == 1)
            }
            if !accepted {
                continuation.resume(returning: .failure(BusError(.overloaded, "\(maxQueued) quota operations already waiting")))
            } else if startThread {
                IOThread.start(name: "quota-ledger") { [self] in loop() }
            } else if wake {
                workArrived.signal()
            }
        }
        // The value was produced by `work`, so it is a T.
        return try result.get() as! T
    }

    /// Runs `read` on memory now, on the caller's thread, if no batch holds memory at this
    /// moment (what memory holds between batches is durable); nil if a batch does, or if `read`
    /// answers nil. For reads that must not wait for a batch's sync: the caller then asks
    /// through `perform`.
    func readNow<T: Sendable>(_ read: (borrowing QuotaMemory) throws -> T?) throws -> T? {
        try memory.withLockIfAvailable { memory in try read(memory) } ?? nil
    }

    private func loop() {
        while true {
            let batch = queue.withLock { queue -> [Pending] in
                let batch = Array(queue.pending.prefix(maxBatch))
                queue.pending.removeFirst(batch.count)
                return batch
            }
            if batch.isEmpty {
                // Idle: wait a little for more, then end the thread (it starts again with the next).
                if workArrived.wait(timeout: .now() + 1) == .timedOut {
                    let ended = queue.withLock { queue -> Bool in
                        if queue.pending.isEmpty { queue.threadRunning = false }
                        return !queue.threadRunning
                    }
                    if ended { return }
                }
                continue
            }
            // The checkpointer's backlog is bounded: wait for it rather than grow it.
            checkpointer.waitForRoom()
            let span = BusTracing.linkedSpan("quota.ledger-commit", linking: batch.map(\.traceParent), attributes: [
                "photoedit.batch.size": "\(batch.count)",
            ])
            let results = run(batch)
            batchCount.add(1, ordering: .relaxed)
            span?.end()
            for (item, result) in zip(batch, results) {
                item.continuation.resume(returning: result)
            }
        }
    }

    private func run(_ batch: [Pending]) -> [Result<any Sendable, any Error>] {
        let applied = checkpointer.appliedSeq
        let broken = self.broken.withLock { $0 }
        return memory.withLock { memory in
            memory.appliedSeq = applied
            // One read transaction for whatever the batch needs that memory lacks. If it fails,
            // each operation reads for itself below and fails alone.
            try? memory.prefetch(batch.compactMap(\.need))
            var results: [Result<any Sendable, any Error>] = []
            var changed: [Bool] = []
            results.reserveCapacity(batch.count)
            for item in batch {
                let before = memory.pendingChanges
                do {
                    results.append(.success(try item.work(&memory)))
                } catch {
                    results.append(.failure(error))
                }
                changed.append(memory.pendingChanges != before)
            }
            guard memory.pendingChanges > 0 else { return results }
            if let failure = durable(&memory, broken: broken) {
                for index in results.indices where changed[index] { results[index] = .failure(failure) }
            }
            return results
        }
    }

    /// Writes and syncs the batch's changes; the error that undid them, if any.
    private func durable(_ memory: inout QuotaMemory, broken: BusError?) -> BusError? {
        if let broken {
            memory.rollBack()
            return broken
        }
        if let log {
            var bytes: [UInt8] = []
            bytes.reserveCapacity(memory.changes.count * 160)
            for change in memory.changes { LedgerFrame.append(change, to: &bytes) }
            do {
                try log.append(bytes)
            } catch {
                // Cut back: nothing of the batch is in the log. The next batch tries again.
                memory.rollBack()
                return error
            }
            do {
                try log.sync()
            } catch {
                memory.rollBack()
                let failure = BusError(.storageUnavailable, "the quota ledger could not be synced; restart the quota service (\(error.message))")
                self.broken.withLock { $0 = failure }
                return failure
            }
        }
        let kept = memory.keep(now: Date())
        checkpointer.submit(kept)
        // A full segment is closed once its changes are durable; failing to begin the next one
        // leaves the current one open, to try again after the next batch.
        try? log?.rollIfFull(nextSeq: memory.lastSeq + 1)
        return nil
    }
}
