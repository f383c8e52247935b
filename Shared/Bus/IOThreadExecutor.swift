#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A task executor whose jobs run on a bus I/O thread, between its socket operations.
///
/// A `BusServer` runs its handlers here, so a request that awaits nothing else is decoded, handled
/// and answered in the turn of the loop that read it. A `BusClient` offers its own as
/// `taskExecutor`: a caller that prefers it sends and receives without any thread hop.
/// Jobs enqueued from other threads wake the I/O thread through its `Wakeup`. Code running here
/// must not block: blocking work belongs on a thread of its own, awaited from here.
final class IOThreadExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs` is guarded by its Mutex; `running`, and every `UnownedJob` run, are the
    // I/O thread's only.
    private let jobs = Mutex<[UnownedJob]>([])
    /// The jobs being run, swapped with `jobs`' buffer each round: both buffers keep their
    /// capacity, so a round allocates nothing. Touched on the I/O thread only.
    private var running: [UnownedJob] = []
    private let owner = Atomic<UInt>(0)
    private let wakeup: Wakeup

    init(wakeup: Wakeup) { self.wakeup = wakeup }

    /// Marks the calling thread as the I/O thread; called first thing on it.
    func adoptCurrentThread() {
        owner.store(UInt(bitPattern: Int(bitPattern: pthread_self())), ordering: .releasing)
    }

    /// Whether the caller runs on the I/O thread, which needs no wake-up: it looks at its queues
    /// before it next sleeps.
    var isCurrentThread: Bool {
        owner.load(ordering: .acquiring) == UInt(bitPattern: Int(bitPattern: pthread_self()))
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let wasEmpty = jobs.withLock { jobs -> Bool in
            jobs.append(unowned)
            return jobs.count == 1
        }
        if wasEmpty && !isCurrentThread { wakeup.signal() }
    }

    /// Whether jobs are waiting to run.
    var hasJobs: Bool { jobs.withLock { !$0.isEmpty } }

    /// Runs the jobs queued so far (and those they enqueue, up to `limit`); called on the I/O
    /// thread only.
    func runQueuedJobs(limit: Int = 4096) {
        var ran = 0
        while ran < limit {
            jobs.withLock { swap(&$0, &running) }
            if running.isEmpty { return }
            for job in running {
                job.runSynchronously(on: asUnownedTaskExecutor())
            }
            ran += running.count
            running.removeAll(keepingCapacity: true)
        }
    }
}
