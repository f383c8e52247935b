import GRDB

/// Runs concurrent writes together: everything submitted while a transaction is being written
/// and synced goes into the next one, so one fsync answers many requests (group commit).
///
/// Each piece of work runs in a savepoint of its own, so one that throws (a bad request, say)
/// rolls back alone and the others in its batch still commit. The caller hears its answer only
/// after the batch is committed, so an answer always describes durable state.
public actor GroupCommitter {
    private struct Pending {
        var work: @Sendable (Database) throws -> any Sendable
        var continuation: CheckedContinuation<Result<any Sendable, any Error>, Never>
    }

    private let writer: any DatabaseWriter
    private let maxBatch: Int
    private var pending: [Pending] = []
    private var flushing = false

    /// Batches writes to `writer`, at most `maxBatch` pieces of work a transaction.
    public init(writer: any DatabaseWriter, maxBatch: Int = 512) {
        self.writer = writer
        self.maxBatch = maxBatch
    }

    /// Runs `work` in the next batch's transaction and returns once that transaction is durable.
    public func perform<T: Sendable>(_ work: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let result = await withCheckedContinuation { continuation in
            pending.append(Pending(work: { try work($0) }, continuation: continuation))
            if !flushing {
                flushing = true
                Task { await self.flush() }
            }
        }
        // The value was produced by `work`, so it is a T.
        return try result.get() as! T
    }

    private func flush() async {
        while !pending.isEmpty {
            let batch = Array(pending.prefix(maxBatch))
            pending.removeFirst(batch.count)
            let results = await Self.write(batch.map(\.work), to: writer)
            for (item, result) in zip(batch, results) {
                item.continuation.resume(returning: result)
            }
        }
        flushing = false
    }

    private static func write(
        _ works: [@Sendable (Database) throws -> any Sendable],
        to writer: any DatabaseWriter
    ) async -> [Result<any Sendable, any Error>] {
        do {
            return try await writer.write { db in
                works.map { work in
                    var outcome: Result<any Sendable, any Error> = .failure(CancellationError())
                    do {
                        try db.inSavepoint {
                            do {
                                outcome = .success(try work(db))
                                return .commit
                            } catch {
                                outcome = .failure(error)
                                return .rollback
                            }
                        }
                    } catch {
                        outcome = .failure(error)
                    }
                    return outcome
                }
            }
        } catch {
            // The transaction itself failed: nothing in the batch was written.
            return works.map { _ in .failure(error) }
        }
    }
}
