import Synchronization

/// A task executor whose jobs run on a bus server's I/O thread, between its socket operations, so
/// a request that needs no other thread is decoded, handled and answered without a thread hop.
///
/// Jobs enqueued from other threads (a handler resuming after awaiting a database, say) wake the
/// I/O thread through its `Wakeup`. Handlers must not block: blocking work belongs on a thread of
/// its own (as GRDB's writer queue is), awaited from the handler.
final class IOThreadExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs` is guarded by its Mutex; `UnownedJob` is only run on the I/O thread.
    private let jobs = Mutex<[UnownedJob]>([])
    private let wakeup: Wakeup

    init(wakeup: Wakeup) { self.wakeup = wakeup }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let wasEmpty = jobs.withLock { jobs -> Bool in
            jobs.append(unowned)
            return jobs.count == 1
        }
        if wasEmpty { wakeup.signal() }
    }

    /// Runs the jobs queued so far (and those they enqueue, up to `limit`); called on the I/O
    /// thread only. Returns whether jobs remain.
    func runQueuedJobs(limit: Int = 4096) -> Bool {
        var ran = 0
        while ran < limit {
            let batch = jobs.withLock { jobs -> [UnownedJob] in
                defer { jobs.removeAll(keepingCapacity: true) }
                return jobs
            }
            if batch.isEmpty { return false }
            for job in batch {
                job.runSynchronously(on: asUnownedTaskExecutor())
            }
            ran += batch.count
        }
        return jobs.withLock { !$0.isEmpty }
    }
}
