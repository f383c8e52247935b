import Bus
import Foundation
import GRDB
import Messages
import Storage
import Synchronization
import Threads
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
    /// An operation: `run` decides it in memory and answers how to resume its caller with what it
    /// produced (called once the batch is durable); `fail` answers it with an error instead.
    fileprivate struct Pending: Sendable {
        var need: QuotaMemory.Need?
        var run: @Sendable (inout QuotaMemory) throws -> @Sendable () -> Void
        var fail: @Sendable (any Error) -> Void
        var traceParent: String
    }

    private let ledger: Ledger
    private let thread: BatchThread<Pending>
    var checkpointer: LedgerCheckpointer { ledger.checkpointer }
    /// How many batches the ledger's thread has run.
    var batches: Int { thread.batches }

    init(memory: sending QuotaMemory, log: LedgerLog?, checkpointer: LedgerCheckpointer, maxBatch: Int = 4096, maxQueued: Int = 65_536) {
        let ledger = Ledger(memory: memory, log: log, checkpointer: checkpointer)
        self.ledger = ledger
        thread = BatchThread(name: "quota-ledger", maxBatch: maxBatch, maxQueued: maxQueued) { ledger.decide($0) }
    }

    /// Runs `work` on the ledger's thread, after loading what `need` names if memory lacks it,
    /// and returns once the changes it made (with the rest of its batch) are durable.
    func perform<T: Sendable>(_ need: QuotaMemory.Need? = nil, _ work: @escaping @Sendable (inout QuotaMemory) throws -> T) async throws -> T {
        let traceParent = BusTracing.currentTraceParent()
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let pending = Pending(
                need: need,
                run: { memory in
                    let value = try work(&memory)
                    return { continuation.resume(returning: value) }
                },
                fail: { continuation.resume(throwing: $0) },
                traceParent: traceParent
            )
            switch thread.submit(pending) {
            case nil: break
            case .full?: continuation.resume(throwing: BusError(.overloaded, "\(thread.maxQueued) quota operations already waiting"))
            case .closed?: continuation.resume(throwing: BusError(.unavailable, "the quota ledger is closing"))
            }
        }
    }

    /// Refuses new operations, and returns once everything accepted is durable and answered.
    func close() async { await thread.close() }

    /// Runs `read` on memory now, on the caller's thread, if no batch holds memory at this
    /// moment (what memory holds between batches is durable); nil if a batch does, or if `read`
    /// answers nil. For reads that must not wait for a batch's sync: the caller then asks
    /// through `perform`.
    func readNow<T: Sendable>(_ read: (borrowing QuotaMemory) throws -> T?) throws -> T? {
        try ledger.memory.withLockIfAvailable { memory in try read(memory) } ?? nil
    }
}

/// What the ledger's thread works on: memory, the log and the checkpointer.
private final class Ledger: Sendable {
    let memory: Mutex<QuotaMemory>
    let log: LedgerLog?
    let checkpointer: LedgerCheckpointer
    /// Set when a sync failed: every later change is refused with it.
    let broken = Mutex<BusError?>(nil)

    init(memory: sending QuotaMemory, log: LedgerLog?, checkpointer: LedgerCheckpointer) {
        self.memory = Mutex(memory)
        self.log = log
        self.checkpointer = checkpointer
    }

    /// One batch, on the ledger's thread: decided in memory, made durable, then answered.
    func decide(_ batch: [QuotaEngine.Pending]) {
        // The checkpointer's backlog is bounded: wait for it rather than grow it.
        checkpointer.waitForRoom()
        let span = BusTracing.linkedSpan("quota.ledger-commit", linking: batch.map(\.traceParent), attributes: [
            "photoedit.batch.size": "\(batch.count)",
        ])
        let outcomes = run(batch)
        span?.end()
        for (item, outcome) in zip(batch, outcomes) {
            switch outcome {
            case .success(let resume): resume()
            case .failure(let error): item.fail(error)
            }
        }
    }

    private func run(_ batch: [QuotaEngine.Pending]) -> [Result<@Sendable () -> Void, any Error>] {
        let applied = checkpointer.appliedSeq
        let broken = self.broken.withLock { $0 }
        return memory.withLock { memory in
            memory.appliedSeq = applied
            // One read transaction for whatever the batch needs that memory lacks. If it fails,
            // each operation reads for itself below and fails alone.
            try? memory.prefetch(batch.compactMap(\.need))
            var results: [Result<@Sendable () -> Void, any Error>] = []
            var changed: [Bool] = []
            results.reserveCapacity(batch.count)
            for item in batch {
                let before = memory.pendingChanges
                do {
                    results.append(.success(try item.run(&memory)))
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
