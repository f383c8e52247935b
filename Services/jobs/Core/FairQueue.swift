import DequeModule

/// A queued job as dispatch sees it.
public struct QueuedJob: Sendable, Equatable {
    public var jobId: String
    public var userId: String
    public var isPro: Bool
    public var effectId: String

    public init(jobId: String, userId: String, isPro: Bool, effectId: String) {
        self.jobId = jobId
        self.userId = userId
        self.isPro = isPro
        self.effectId = effectId
    }
}

/// Fair dispatch order: round-robin across the users with queued work, each user's jobs in the
/// order they came, so one user's burst does not starve anyone. With `proFirst`, users with PRO
/// jobs are served before the rest.
public struct FairQueue: Sendable {
    private var perUser: [String: Deque<QueuedJob>] = [:]
    /// Users in turn order: PRO ring first (when `proFirst`), then everyone else.
    private var rings: [Deque<String>] = [[], []]
    private var ringOfUser: [String: Int] = [:]
    /// Each queued job's user, by job id: whether a job waits is one lookup, not a walk through
    /// its user's jobs (a leader's catch-up asks it of every queued row; one user's thousands of
    /// queued jobs made that quadratic: 14% of the jobs service's CPU in `bench-jobs` on
    /// PostgreSQL).
    private var queued: [String: String] = [:]
    public private(set) var count = 0
    public let proFirst: Bool

    public init(proFirst: Bool = true) { self.proFirst = proFirst }

    /// Adds `job` behind the user's other queued jobs (`atFront`: ahead of them, for a job that
    /// lost its worker and was first in line already).
    public mutating func push(_ job: QueuedJob, atFront: Bool = false) {
        if atFront { perUser[job.userId, default: []].prepend(job) } else { perUser[job.userId, default: []].append(job) }
        queued[job.jobId] = job.userId
        count += 1
        if ringOfUser[job.userId] == nil {
            let ring = proFirst && job.isPro ? 0 : 1
            ringOfUser[job.userId] = ring
            rings[ring].append(job.userId)
        }
    }

    /// How far into one user's jobs `pop` looks for one a worker takes: a user's first job whose
    /// effect no connected worker runs does not hold up the rest, within this bound.
    public static let lookahead = 64

    /// Takes the next job in fair order that `accepts` takes (a worker that runs its effect): the
    /// user whose turn it is gives their oldest job the worker takes.
    public mutating func pop(where accepts: (QueuedJob) -> Bool = { _ in true }) -> QueuedJob? {
        for ring in rings.indices {
            for _ in 0..<rings[ring].count {
                let user = rings[ring].removeFirst()
                // Read and changed in place: a copy of the user's jobs would be a copy of all
                // of them on every pop.
                guard let waiting = perUser[user]?.count, waiting > 0 else {
                    perUser[user] = nil
                    ringOfUser[user] = nil
                    continue
                }
                guard let index = perUser[user]?.prefix(Self.lookahead).firstIndex(where: accepts) else {
                    rings[ring].append(user)
                    continue
                }
                let job = perUser[user]!.remove(at: index)
                queued[job.jobId] = nil
                count -= 1
                if waiting == 1 {
                    perUser[user] = nil
                    ringOfUser[user] = nil
                } else {
                    rings[ring].append(user)
                }
                return job
            }
        }
        return nil
    }

    /// Whether the job waits in the queue.
    public func contains(jobId: String, userId: String) -> Bool {
        queued[jobId] == userId
    }

    /// Removes a queued job (it was cancelled); false if it is not queued.
    @discardableResult
    public mutating func remove(jobId: String, userId: String) -> Bool {
        guard queued[jobId] == userId, let index = perUser[userId]?.firstIndex(where: { $0.jobId == jobId }) else { return false }
        perUser[userId]!.remove(at: index)
        queued[jobId] = nil
        count -= 1
        if perUser[userId]!.isEmpty {
            perUser[userId] = nil
            if let ring = ringOfUser.removeValue(forKey: userId), let position = rings[ring].firstIndex(of: userId) {
                rings[ring].remove(at: position)
            }
        }
        return true
    }
}
