import BinaryWire
import Foundation

/// The jobs service's methods: creating, reading and cancelling edit jobs.
public enum Jobs {
    /// Creates a job (idempotent by job id: the same id returns the existing job).
    public static let create = BusMethod<CreateJob, JobRecord>("jobs.create", roles: [.gateway], retrySafe: true)
    /// A job, if it belongs to the user (else `not_found`).
    public static let get = BusMethod<JobReference, JobRecord>("jobs.get", roles: [.gateway, .operator], retrySafe: true)
    /// Cancels a job: at once if queued, through the worker if processing.
    public static let cancel = BusMethod<JobReference, JobRecord>("jobs.cancel", roles: [.gateway, .operator], retrySafe: true)
    /// Whether a job exists and in which state, for quota's stale reservations (no user check).
    public static let lookup = BusMethod<JobLookup, JobExistence>("jobs.lookup", roles: [.quota, .operator], retrySafe: true)
    /// The effects the workers can run, with their prices, kinds and parameter schemas, and the
    /// other names the app may use for them.
    public static let effects = BusMethod<Empty, EffectList>("jobs.effects", roles: [.gateway, .operator], retrySafe: true)
    /// Removes a job for good (history's delete and retention): cancelled first if it has not
    /// ended (its charge released), then its row, its result and thumbnail files, and its original
    /// upload once no other job of the user refers to it. Idempotent: an unknown job is purged.
    public static let purge = BusMethod<JobReference, JobPurged>("jobs.purge", roles: [.history, .operator], retrySafe: true)
    /// Of the jobs named (at most `WatchJobs.maxJobs`), those whose version or live progress
    /// differs from what the caller has, and those that are gone: how the gateway feeds every
    /// open event stream with one call a round instead of one call per stream.
    public static let watch = BusMethod<WatchJobs, WatchedJobs>("jobs.watch", roles: [.gateway], retrySafe: true)

    /// A provider's webhook reached the gateway for this job (its signature checked there): the
    /// worker waiting on the job's generation asks the provider now instead of at its next poll.
    /// The webhook's body is never trusted; only the provider's own answer to that poll is.
    public static let providerCallback = BusMethod<ProviderCallback, Empty>("jobs.provider-callback", roles: [.gateway], retrySafe: true)

    /// The credits a job is charged when its effect names no price.
    public static let defaultCredits = 1

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
public enum JobStatus: String, Codable, BinaryStringEnum, Sendable, CaseIterable {
    case queued, processing, completed, failed, cancelled

    /// Whether the job has ended.
    public var isTerminal: Bool { self == .completed || self == .failed || self == .cancelled }
}

/// Asks to create a job. The gateway has authenticated the user and reserved quota for `jobId`.
@BinaryMessage
public struct CreateJob: Codable, Sendable, Equatable {
    public var jobId: String
    public var userId: String
    public var isPro: Bool
    public var imageKey: String
    public var effectId: String
    public var parameters: [String: Double]
    public var prompt: String?
    /// The credits the gateway reserved for the job (the effect's price when it was asked); the
    /// job gives exactly these back if it fails, and history shows them.
    @DefaultWhenAbsent(Jobs.defaultCredits)
    public var credits: Int
    /// Set by the jobs service as it handles the request (its span's `traceparent`), not by
    /// callers: the trace the job joins.
    public var traceParent: String?
    /// The version of the image the gateway checked (an object store's `ETag`; nil in the
    /// folder store, where an upload's key is written once): the job's input is read only as
    /// that version, so the image a job was created from never changes under it.
    public var imageETag: String?

    public init(jobId: String, userId: String, isPro: Bool, imageKey: String, effectId: String, parameters: [String: Double] = [:], prompt: String? = nil,
                credits: Int = Jobs.defaultCredits, imageETag: String? = nil) {
        self.imageETag = imageETag
        self.jobId = jobId
        self.userId = userId
        self.isPro = isPro
        self.imageKey = imageKey
        self.effectId = effectId
        self.parameters = parameters
        self.prompt = prompt
        self.credits = credits
    }

    /// `traceParent` is set by the jobs service as it handles the request, never sent.
    enum CodingKeys: String, CodingKey { case jobId, userId, isPro, imageKey, effectId, parameters, prompt, credits, imageETag }
}

/// The effect catalogue: every effect, and the aliases (`default`) that name one of them.
public struct EffectList: Codable, Sendable, Equatable {
    public var effects: [EffectDescription]
    public var aliases: [String: String]
    public init(effects: [EffectDescription], aliases: [String: String]) {
        self.effects = effects
        self.aliases = aliases
    }

    /// The effect `id` names, directly or through an alias.
    public func effect(_ id: String) -> EffectDescription? {
        effects.first { $0.id == id } ?? aliases[id].flatMap { target in effects.first { $0.id == target } }
    }
}

/// A provider's webhook for a job, as the gateway passes it on once its signature is checked.
public struct ProviderCallback: Codable, Sendable, Equatable {
    public var jobId: String
    /// The provider's request id the webhook names (compared with the job's own).
    public var requestId: String?
    public init(jobId: String, requestId: String?) {
        self.jobId = jobId
        self.requestId = requestId
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
@BinaryMessage
public struct WatchJobs: Codable, Sendable, Equatable {
    /// The most jobs one `watch` call may name.
    public static let maxJobs = 1_000

    @BinaryMessage
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
@BinaryMessage
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
    /// When the job ended, if it has and is still kept.
    public var finishedAt: Date?
    public init(exists: Bool, status: JobStatus?, finishedAt: Date? = nil) {
        self.exists = exists
        self.status = status
        self.finishedAt = finishedAt
    }
}

/// A job as the jobs service keeps it.
@BinaryMessage
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
    @DefaultWhenAbsent(false)
    public var cancelRequested: Bool
    /// The credits reserved for the job: committed when it completes, given back otherwise.
    @DefaultWhenAbsent(Jobs.defaultCredits)
    public var credits: Int
    /// The provider's request of a long generation submitted to a provider's queue (fal), kept
    /// durably so that any worker, after any restart, waits on the same request instead of
    /// submitting (and paying for) another.
    public var submission: ProviderRequest?
    /// The trace the job was created in (a W3C `traceparent` of the jobs service's span for its
    /// creation), kept so that its dispatch and its worker's run join that trace, and so that
    /// the trace of an edit can be found from the job; nil when the process did not trace.
    public var traceParent: String?
    /// The version of the input image the job was created from (`CreateJob.imageETag`).
    public var imageETag: String?

    public init(
        id: String, userId: String, isPro: Bool, imageKey: String, effectId: String, parameters: [String: Double],
        prompt: String?, status: JobStatus, progress: Double, attempts: Int, maxAttempts: Int, lastError: String?,
        resultKey: String?, thumbnailKey: String?, createdAt: Date, updatedAt: Date, startedAt: Date?, finishedAt: Date?, version: Int,
        cancelRequested: Bool = false, credits: Int = Jobs.defaultCredits, submission: ProviderRequest? = nil, traceParent: String? = nil,
        imageETag: String? = nil
    ) {
        self.imageETag = imageETag
        self.traceParent = traceParent
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
        self.credits = credits
        self.submission = submission
    }
}

/// A request submitted to a provider's queue (fal's queue API): its id and the URLs fal answered
/// with for its status, its result and its cancellation.
public struct ProviderRequest: Codable, Sendable, Equatable {
    public var provider: String
    public var requestId: String
    public var statusURL: String
    public var responseURL: String
    public var cancelURL: String?
    /// When it was submitted: the model's timeout counts from here, across workers and restarts.
    public var submittedAt: Date
    public init(provider: String, requestId: String, statusURL: String, responseURL: String, cancelURL: String?, submittedAt: Date) {
        self.provider = provider
        self.requestId = requestId
        self.statusURL = statusURL
        self.responseURL = responseURL
        self.cancelURL = cancelURL
        self.submittedAt = submittedAt
    }
}

/// What an effect makes: a still image or a video.
public enum MediaKind: String, Codable, BinaryStringEnum, Sendable, CaseIterable {
    case image, video
}

/// An effect the app can ask for: its id, the title the app shows, its parameters. Every field but
/// `id` may be left out of the operator's file and takes its `@DefaultWhenAbsent` value, so an
/// operator writes only what matters.
@BinaryMessage
public struct EffectDescription: Codable, Sendable, Equatable {
    @BinaryMessage
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
    @DefaultWhenAbsent(copying: \EffectDescription.id)
    public var title: String
    @DefaultWhenAbsent([Parameter]())
    public var parameters: [Parameter]
    /// How the worker runs it: `vips` or `copy` (built in), a provider (`gemini`, `openai`,
    /// `fal`), or `remote` (the operator's own HTTP endpoint).
    @DefaultWhenAbsent("vips")
    public var processor: String
    /// For `remote`: the endpoint's URL. For a provider: its base URL instead of the public one
    /// (a regional endpoint, a proxy, or a local server in tests).
    public var endpoint: String?
    /// What one job costs, in credits (the units of the quota windows).
    @DefaultWhenAbsent(Jobs.defaultCredits)
    public var credits: Int
    /// What it makes: an image, or a video (stored as `video/mp4`, its first frame the thumbnail).
    @DefaultWhenAbsent(MediaKind.image)
    public var kind: MediaKind
    /// For a provider: the provider's own model id (`gemini-2.5-flash-image`, `gpt-image-1`,
    /// `fal-ai/veo3.1/image-to-video`).
    public var model: String?
    /// How long one attempt may wait for the model before it fails as retryable; nil: the
    /// default of its kind (the worker's `WORKER_IMAGE_TIMEOUT_S`, `WORKER_VIDEO_TIMEOUT_S`).
    public var timeoutSeconds: Int?

    public init(id: String, title: String, parameters: [Parameter] = [], processor: String = "vips", endpoint: String? = nil,
                credits: Int = Jobs.defaultCredits, kind: MediaKind = .image, model: String? = nil, timeoutSeconds: Int? = nil) {
        self.id = id
        self.title = title
        self.parameters = parameters
        self.processor = processor
        self.endpoint = endpoint
        self.credits = credits
        self.kind = kind
        self.model = model
        self.timeoutSeconds = timeoutSeconds
    }
}
