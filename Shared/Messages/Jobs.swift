import Foundation

/// The jobs service's methods: creating, reading and cancelling edit jobs.
public enum Jobs {
    /// Creates a job (idempotent by job id: the same id returns the existing job).
    public static let create = BusMethod<CreateJob, JobRecord>("jobs.create")
    /// A job, if it belongs to the user (else `not_found`).
    public static let get = BusMethod<JobReference, JobRecord>("jobs.get")
    /// Cancels a job: at once if queued, through the worker if processing.
    public static let cancel = BusMethod<JobReference, JobRecord>("jobs.cancel")
    /// Whether a job exists and in which state, for quota's stale reservations (no user check).
    public static let lookup = BusMethod<JobLookup, JobExistence>("jobs.lookup")
    /// The effects the workers can run, with their parameter schemas.
    public static let effects = BusMethod<Empty, [EffectDescription]>("jobs.effects")
    /// Removes a job for good (history's delete and retention): cancelled first if it has not
    /// ended (its charge released), then its row, its result and thumbnail files, and its original
    /// upload once no other job of the user refers to it. Idempotent: an unknown job is purged.
    public static let purge = BusMethod<JobReference, JobPurged>("jobs.purge")
    /// Of the jobs named (at most `WatchJobs.maxJobs`), those whose version or live progress
    /// differs from what the caller has, and those that are gone: how the gateway feeds every
    /// open event stream with one call a round instead of one call per stream.
    public static let watch = BusMethod<WatchJobs, WatchedJobs>("jobs.watch")

    /// The credits one job is charged (reserved at creation, committed when it completes).
    public static let chargePerJob = 1

    public enum ErrorCode {
        /// The effect is not in the catalogue.
        public static let unknownEffect = BusError.Code("jobs.unknown_effect")
        /// The parameters do not fit the effect's schema.
        public static let invalidParameters = BusError.Code("jobs.invalid_parameters")
        /// The job has ended and cannot be cancelled.
        public static let alreadyFinished = BusError.Code("jobs.already_finished")
        /// Too many jobs are queued; try later.
        public static let queueFull = BusError.Code("jobs.queue_full")
        /// The id was abandoned: its creation came so late that quota had already given its
        /// reservation back (a lost request retried long after). Send a new creation.
        public static let abandoned = BusError.Code("jobs.abandoned")
    }
}

/// A job's lifecycle: `queued -> processing -> completed | failed | cancelled`.
public enum JobStatus: String, Codable, Sendable, CaseIterable {
    case queued, processing, completed, failed, cancelled

    /// Whether the job has ended.
    public var isTerminal: Bool { self == .completed || self == .failed || self == .cancelled }
}

/// Asks to create a job. The gateway has authenticated the user and reserved quota for `jobId`.
public struct CreateJob: Codable, Sendable, Equatable {
    public var jobId: String
    public var userId: String
    public var isPro: Bool
    public var imageKey: String
    public var effectId: String
    public var parameters: [String: Double]
    public var prompt: String?

    public init(jobId: String, userId: String, isPro: Bool, imageKey: String, effectId: String, parameters: [String: Double] = [:], prompt: String? = nil) {
        self.jobId = jobId
        self.userId = userId
        self.isPro = isPro
        self.imageKey = imageKey
        self.effectId = effectId
        self.parameters = parameters
        self.prompt = prompt
    }
}

/// Names a job on behalf of a user.
public struct JobReference: Codable, Sendable, Equatable {
    public var jobId: String
    public var userId: String
    public init(jobId: String, userId: String) {
        self.jobId = jobId
        self.userId = userId
    }
}

/// The answer to `purge`: whether there was a job to remove.
public struct JobPurged: Codable, Sendable, Equatable {
    public var existed: Bool
    public init(existed: Bool) { self.existed = existed }
}

/// The jobs a caller follows, each with the version and progress it has seen.
public struct WatchJobs: Codable, Sendable, Equatable {
    /// The most jobs one `watch` call may name.
    public static let maxJobs = 1_000

    public struct Seen: Codable, Sendable, Equatable {
        public var jobId: String
        public var userId: String
        public var version: Int
        public var progress: Double
        public init(jobId: String, userId: String, version: Int, progress: Double) {
            self.jobId = jobId
            self.userId = userId
            self.version = version
            self.progress = progress
        }
    }

    public var jobs: [Seen]
    public init(jobs: [Seen]) { self.jobs = jobs }
}

/// The answer to `watch`: the jobs that changed, as they are now, and the ids of those that no
/// longer exist (or are not the user's).
public struct WatchedJobs: Codable, Sendable, Equatable {
    public var changed: [JobRecord]
    public var gone: [String]
    public init(changed: [JobRecord], gone: [String]) {
        self.changed = changed
        self.gone = gone
    }
}

/// Names a job without a user (service-to-service).
public struct JobLookup: Codable, Sendable, Equatable {
    public var jobId: String
    /// If no such job exists, record the id as abandoned in the same transaction, so that it
    /// can never be created later (quota's stale-reservation resolver asks this before it gives
    /// the units back: a creation still on its way then fails instead of running free).
    public var abandonIfAbsent: Bool

    public init(jobId: String, abandonIfAbsent: Bool = false) {
        self.jobId = jobId
        self.abandonIfAbsent = abandonIfAbsent
    }

    enum CodingKeys: String, CodingKey { case jobId, abandonIfAbsent }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        jobId = try container.decode(String.self, forKey: .jobId)
        abandonIfAbsent = try container.decodeIfPresent(Bool.self, forKey: .abandonIfAbsent) ?? false
    }
}

/// Whether a job exists, and its status if it does.
public struct JobExistence: Codable, Sendable, Equatable {
    public var exists: Bool
    public var status: JobStatus?
    public init(exists: Bool, status: JobStatus?) {
        self.exists = exists
        self.status = status
    }
}

/// A job as the jobs service keeps it.
public struct JobRecord: Codable, Sendable, Equatable {
    public var id: String
    public var userId: String
    public var isPro: Bool
    public var imageKey: String
    public var effectId: String
    public var parameters: [String: Double]
    public var prompt: String?
    public var status: JobStatus
    /// 0 to 1.
    public var progress: Double
    /// Attempts started so far.
    public var attempts: Int
    public var maxAttempts: Int
    public var lastError: String?
    public var resultKey: String?
    public var thumbnailKey: String?
    public var createdAt: Date
    public var updatedAt: Date
    public var startedAt: Date?
    public var finishedAt: Date?
    /// Increases with every state change: events carry it so consumers apply each once.
    public var version: Int
    /// The user asked to cancel while the job was processing; its worker has been told.
    public var cancelRequested: Bool

    public init(
        id: String, userId: String, isPro: Bool, imageKey: String, effectId: String, parameters: [String: Double],
        prompt: String?, status: JobStatus, progress: Double, attempts: Int, maxAttempts: Int, lastError: String?,
        resultKey: String?, thumbnailKey: String?, createdAt: Date, updatedAt: Date, startedAt: Date?, finishedAt: Date?, version: Int,
        cancelRequested: Bool = false
    ) {
        self.id = id
        self.userId = userId
        self.isPro = isPro
        self.imageKey = imageKey
        self.effectId = effectId
        self.parameters = parameters
        self.prompt = prompt
        self.status = status
        self.progress = progress
        self.attempts = attempts
        self.maxAttempts = maxAttempts
        self.lastError = lastError
        self.resultKey = resultKey
        self.thumbnailKey = thumbnailKey
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.version = version
        self.cancelRequested = cancelRequested
    }
}

/// An effect the app can ask for: its id, the title the app shows, its parameters.
public struct EffectDescription: Codable, Sendable, Equatable {
    public struct Parameter: Codable, Sendable, Equatable {
        public var name: String
        public var minimum: Double
        public var maximum: Double
        public var defaultValue: Double
        public init(name: String, minimum: Double, maximum: Double, defaultValue: Double) {
            self.name = name
            self.minimum = minimum
            self.maximum = maximum
            self.defaultValue = defaultValue
        }
    }

    public var id: String
    public var title: String
    public var parameters: [Parameter]
    /// How the worker runs it: `vips` (built in) or `remote` (an HTTP inference endpoint).
    public var processor: String
    /// For `remote`: the endpoint's URL.
    public var endpoint: String?

    public init(id: String, title: String, parameters: [Parameter] = [], processor: String = "vips", endpoint: String? = nil) {
        self.id = id
        self.title = title
        self.parameters = parameters
        self.processor = processor
        self.endpoint = endpoint
    }

    enum CodingKeys: String, CodingKey { case id, title, parameters, processor, endpoint }

    /// Decodes an effect; `parameters` defaults to none and `processor` to `vips`, so an operator
    /// writes only what matters.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        title = try container.decodeIfPresent(String.self, forKey: .title) ?? id
        parameters = try container.decodeIfPresent([Parameter].self, forKey: .parameters) ?? []
        processor = try container.decodeIfPresent(String.self, forKey: .processor) ?? "vips"
        endpoint = try container.decodeIfPresent(String.self, forKey: .endpoint)
    }
}
