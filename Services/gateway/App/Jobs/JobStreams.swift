import Bus
import Logging
import Messages
import ServiceLifecycle
import Synchronization

/// The gateway's open job event streams, fed by one `jobs.watch` call a round for all of them.
///
/// Each stream subscribes to its job. Every `interval` the hub sends jobs the version and
/// progress it last saw of each watched job (in calls of at most `WatchJobs.maxJobs`), and hands
/// what changed to every stream of that job: the jobs service's cost grows with the number of
/// jobs followed, read in one transaction a round, not with a poll per stream. Streams are
/// bounded per user and in total; a stream ends when its job ends, is gone, or its client leaves
/// (the route closes its subscription), and every `keepalive` each gets a comment line so that
/// proxies keep it open and a half-dead connection fails its write.
public final class JobStreams: Service, Sendable {
    /// What a stream is told.
    enum Update: Sendable {
        case status(JobRecord)
        case keepalive
        /// The job no longer exists (deleted).
        case gone
    }

    /// An open stream's hold on its job; closing it (or dropping it) frees its place.
    final class Subscription: Sendable {
        let id: Int
        let jobId: String
        let userId: String
        let updates: AsyncStream<Update>
        private weak let hub: JobStreams?

        init(id: Int, jobId: String, userId: String, updates: AsyncStream<Update>, hub: JobStreams) {
            self.id = id
            self.jobId = jobId
            self.userId = userId
            self.updates = updates
            self.hub = hub
        }

        /// Frees the stream's place; idempotent.
        func close() { hub?.close(self) }

        deinit { hub?.close(self) }
    }

    struct Watched {
        var userId: String
        var last: JobRecord
        var subscribers: [Int: AsyncStream<Update>.Continuation] = [:]
    }

    struct State {
        var watched: [String: Watched] = [:]
        var perUser: [String: Int] = [:]
        var total = 0
        var nextId = 0
        var open: Set<Int> = []
    }

    private let jobs: BusClient
    private let perUser: Int
    private let maximum: Int
    private let interval: Duration
    private let keepalive: Duration
    private let failures: FailureLog
    private let state = Mutex(State())

    public init(jobs: BusClient, perUser: Int, total: Int, interval: Duration = .milliseconds(250), keepalive: Duration = .seconds(15), logger: Logger) {
        self.jobs = jobs
        self.perUser = perUser
        self.maximum = total
        self.interval = interval
        self.keepalive = keepalive
        self.failures = FailureLog(logger: logger)
    }

    /// Opens a stream of `job` for `userId`; a 503 problem when the user or the gateway has as
    /// many open as allowed.
    func open(_ job: JobRecord, userId: String) throws -> Subscription {
        let (updates, continuation) = AsyncStream.makeStream(of: Update.self, bufferingPolicy: .bufferingNewest(8))
        let id: Int = try state.withLock { state in
            guard state.total < maximum else {
                throw Problem(.serviceUnavailable, detail: "The gateway has \(maximum) event streams open; poll the job's status or try again later.",
                              headers: [.retryAfter: "5"], extensions: ["code": .string("too_many_streams")])
            }
            guard state.perUser[userId, default: 0] < perUser else {
                throw Problem(.serviceUnavailable, detail: "At most \(perUser) event streams may be open at once; close one or poll the job's status.",
                              headers: [.retryAfter: "5"], extensions: ["code": .string("too_many_streams")])
            }
            state.nextId += 1
            state.total += 1
            state.perUser[userId, default: 0] += 1
            state.open.insert(state.nextId)
            var watched = state.watched[job.id] ?? Watched(userId: userId, last: job)
            if watched.last.version < job.version || (watched.last.version == job.version && watched.last.progress < job.progress) {
                watched.last = job
            }
            if watched.last != job { continuation.yield(.status(watched.last)) }
            watched.subscribers[state.nextId] = continuation
            state.watched[job.id] = watched
            return state.nextId
        }
        return Subscription(id: id, jobId: job.id, userId: userId, updates: updates, hub: self)
    }

    fileprivate func close(_ subscription: Subscription) {
        let continuation: AsyncStream<Update>.Continuation? = state.withLock { state in
            guard state.open.remove(subscription.id) != nil else { return nil }
            state.total -= 1
            state.perUser[subscription.userId, default: 1] -= 1
            if state.perUser[subscription.userId] == 0 { state.perUser[subscription.userId] = nil }
            let continuation = state.watched[subscription.jobId]?.subscribers.removeValue(forKey: subscription.id)
            if state.watched[subscription.jobId]?.subscribers.isEmpty == true { state.watched[subscription.jobId] = nil }
            return continuation
        }
        continuation?.finish()
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            var lastKeepalive = ContinuousClock.now
            while !Task.isCancelled {
                try await Task.sleep(for: self.interval)
                await self.round()
                if lastKeepalive.duration(to: .now) >= self.keepalive {
                    lastKeepalive = .now
                    self.broadcastKeepalive()
                }
            }
        }
        // Shutting down: end every stream so its connection can close.
        let all = state.withLock { state in state.watched.values.flatMap { $0.subscribers.values } }
        for continuation in all { continuation.finish() }
    }

    /// One round: asks jobs what changed among the watched jobs and tells their streams.
    func round() async {
        let seen = state.withLock { state in
            state.watched.map { WatchJobs.Seen(jobId: $0.key, userId: $0.value.userId, version: $0.value.last.version, progress: $0.value.last.progress) }
        }
        var start = 0
        while start < seen.count {
            let batch = Array(seen[start..<min(start + WatchJobs.maxJobs, seen.count)])
            start += batch.count
            do {
                let answer = try await jobs.call(Jobs.watch, WatchJobs(jobs: batch), timeout: .seconds(2))
                failures.recovered("watch")
                deliver(answer)
            } catch {
                failures.record("watch", "cannot follow jobs for event streams: \(error)")
            }
        }
    }

    private func deliver(_ answer: WatchedJobs) {
        var messages: [(AsyncStream<Update>.Continuation, Update, finish: Bool)] = []
        state.withLock { state in
            for job in answer.changed {
                guard var watched = state.watched[job.id] else { continue }
                watched.last = job
                state.watched[job.id] = watched
                for continuation in watched.subscribers.values { messages.append((continuation, .status(job), job.status.isTerminal)) }
            }
            for id in answer.gone {
                for continuation in state.watched[id].map({ Array($0.subscribers.values) }) ?? [] { messages.append((continuation, .gone, true)) }
            }
        }
        for (continuation, update, finish) in messages {
            continuation.yield(update)
            if finish { continuation.finish() }
        }
    }

    private func broadcastKeepalive() {
        let all = state.withLock { state in state.watched.values.flatMap { $0.subscribers.values } }
        for continuation in all { continuation.yield(.keepalive) }
    }
}
