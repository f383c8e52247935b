import BinaryWire
import Foundation

/// The worker protocol (after the ZeroMQ Guide's Majordomo and Paranoid Pirate patterns): a worker
/// connects to the jobs service's worker endpoint, says `ready` with its capacity and effects,
/// is assigned jobs with an attempt number, sends heartbeats (naming the attempts it holds) and
/// progress, and ends each job with `done`, `failed` or `cancelled`, which it sends again with
/// every heartbeat until the service answers `recorded` (or `refused`). Heartbeats go both ways:
/// the service's every second, a worker's at the interval it announced in `ready`; a peer silent
/// for three of its own intervals is dead.

/// The most messages either side puts in one `all`.
public let workerProtocolMaxBatch = 64

/// What a worker tells the jobs service.
@BinaryMessage
public enum WorkerMessage: Codable, Sendable, Equatable {
    case ready(WorkerReady)
    /// The attempts the worker holds: running, or finished with the result not yet recorded.
    case heartbeat(running: [JobAttempt])
    case progress(JobAttempt, fraction: Double)
    case done(JobAttempt, JobOutput)
    case failed(JobAttempt, error: String, retryable: Bool)
    /// The worker stopped a job after a `cancel`.
    case cancelled(JobAttempt)
    /// The worker's metrics (Prometheus text), sent every few seconds; the jobs service answers
    /// for them when it is scraped.
    case metrics(String)
    /// The worker is stopping: it takes no more jobs, gives back the prefetched ones it will not
    /// run, and finishes (and reports) the ones it runs before it goes.
    case leaving(returned: [JobAttempt])
    /// The presigned URLs of an attempt the worker holds have expired (or are about to) before
    /// it could use them: it asks for fresh ones.
    case renew(JobAttempt)
    /// The attempt's generation was submitted to a provider's queue: the service records the
    /// request durably and stops counting the job against the worker's slots (the worker waits
    /// on it without one). Sent again with every heartbeat until `submissionRecorded`.
    case submitted(JobAttempt, ProviderRequest)
    /// The attempt's image model (a provider's, or a `remote` endpoint) answered: the rest of the
    /// job (checking the answer, its thumbnail, the writes) calls no model, so the service counts
    /// it against neither the worker's slots nor the provider's limit, and hands the slot to the
    /// next job. At most once per attempt, and for no more attempts at once than the worker's
    /// capacity.
    case answered(JobAttempt)
    /// Several messages in one, handled in order (results that ended together, say): sent only
    /// to a service that answered `ready` with `batches`. Never nested.
    case all([WorkerMessage])
}

/// What the jobs service tells a worker.
@BinaryMessage
public enum DispatcherMessage: Codable, Sendable, Equatable {
    case assign(JobAssignment)
    case cancel(JobAttempt)
    case heartbeat
    /// The service does not know this worker (it restarted, or declared it dead): say `ready` again.
    case reconnect
    /// A result was refused, e.g. from a stale attempt: the worker stops sending it.
    case refused(JobAttempt, reason: String)
    /// A result (done, failed or cancelled) is durably recorded: the worker stops sending it.
    case recorded(JobAttempt)
    /// Fresh URLs for an attempt the worker holds, in answer to `renew`.
    case renewed(JobAttempt, JobTransfer)
    /// The attempt's provider request is durable: the worker stops sending `submitted`.
    case submissionRecorded(JobAttempt)
    /// The provider's webhook came for this attempt's request: ask the provider now.
    case poke(JobAttempt)
    /// In answer to `leaving`: the service sends this worker no more jobs. Assignments it sent
    /// before arrive before this (one connection keeps its order), so a stopping worker that has
    /// heard it has heard every job it must run or give back, and may go.
    case leaveNoted
    /// In answer to a `ready` that announced `batches`: this service takes `WorkerMessage.all`,
    /// and may send `all`.
    case batches
    /// Several messages in one, handled in order (the assignments and `recorded`s of one
    /// transaction, say): sent only to a worker that announced `batches`. Never nested.
    case all([DispatcherMessage])
}

/// A worker's introduction.
public struct WorkerReady: Codable, Sendable, Equatable {
    public var workerId: String
    /// Jobs it runs at once.
    public var capacity: Int
    /// Effect ids it can run.
    public var effects: [String]
    /// How often it sends heartbeats, in milliseconds: the jobs service declares it dead after
    /// three of these intervals of silence. Nil (a worker from before this field): the service's
    /// own interval.
    public var heartbeatMilliseconds: Int?
    /// Jobs it takes beyond `capacity` and keeps waiting, so that the next one is in hand when
    /// one ends (its result's round trip to the service overlaps the next job). Nil: none.
    public var prefetch: Int?
    /// It takes and sends several messages in one (`all`) once the service answers `batches`.
    /// Nil: a worker from before batches, sent one message at a time.
    public var batches: Bool?
    /// The host it runs on, and its build's version, for operators. Nil: not said.
    public var host: String?
    public var version: String?
    public init(workerId: String, capacity: Int, effects: [String], heartbeatMilliseconds: Int? = nil, prefetch: Int? = nil, batches: Bool? = nil,
                host: String? = nil, version: String? = nil) {
        self.batches = batches
        self.host = host
        self.version = version
        self.workerId = workerId
        self.capacity = capacity
        self.effects = effects
        self.heartbeatMilliseconds = heartbeatMilliseconds
        self.prefetch = prefetch
    }
}

/// One attempt at one job: results are accepted only from the current attempt (fencing).
@BinaryMessage
public struct JobAttempt: Codable, Sendable, Hashable {
    public var jobId: String
    public var attempt: Int
    public init(jobId: String, attempt: Int) {
        self.jobId = jobId
        self.attempt = attempt
    }
}

/// A job handed to a worker.
@BinaryMessage
public struct JobAssignment: Codable, Sendable, Equatable {
    public var attempt: JobAttempt
    public var userId: String
    public var imageKey: String
    public var effect: EffectDescription
    public var parameters: [String: Double]
    public var prompt: String?
    /// Where the worker reads the input and writes the outputs: presigned URLs made by the jobs
    /// service, which alone holds the store's credentials. Nil only in the state machine, before
    /// the dispatcher signs them on sending.
    public var transfer: JobTransfer?
    /// A generation an earlier attempt submitted to the provider's queue: this attempt waits
    /// on it (nothing is submitted, or paid for, twice).
    public var submission: ProviderRequest?
    /// The URL the provider's webhook is to call for this job (signed by the jobs service), for
    /// providers with webhooks (fal).
    public var callbackURL: String?
    /// The trace the worker's run joins (a W3C `traceparent` of the jobs service's dispatch
    /// span); nil when jobs does not trace.
    public var traceParent: String?
    /// The version of the input the job was created from (`JobRecord.imageETag`): the worker
    /// reads the input only as that version (`If-Match`), and fails the job for good if it was
    /// replaced. Nil: any (the folder store's keys are written once).
    public var imageETag: String?
    public init(attempt: JobAttempt, userId: String, imageKey: String, effect: EffectDescription, parameters: [String: Double], prompt: String?,
                transfer: JobTransfer? = nil, submission: ProviderRequest? = nil, callbackURL: String? = nil, traceParent: String? = nil,
                imageETag: String? = nil) {
        self.imageETag = imageETag
        self.traceParent = traceParent
        self.submission = submission
        self.callbackURL = callbackURL
        self.attempt = attempt
        self.userId = userId
        self.imageKey = imageKey
        self.effect = effect
        self.parameters = parameters
        self.prompt = prompt
        self.transfer = transfer
    }
}

/// An attempt's presigned URLs: a GET of its input, and a PUT for each output under the key it
/// is to have. With the S3 store they are the bucket's own; with the folder store, the
/// gateway's signed routes. Both work only until `expiresAt`.
@BinaryMessage
public struct JobTransfer: Codable, Sendable, Equatable {
    public var inputURL: String
    public var result: PresignedWrite
    public var thumbnail: PresignedWrite
    public var expiresAt: Date
    public init(inputURL: String, result: PresignedWrite, thumbnail: PresignedWrite, expiresAt: Date) {
        self.inputURL = inputURL
        self.result = result
        self.thumbnail = thumbnail
        self.expiresAt = expiresAt
    }
}

/// Where one output goes: its key, and the URL and headers of the `PUT` that writes it.
@BinaryMessage
public struct PresignedWrite: Codable, Sendable, Equatable {
    public var key: String
    public var url: String
    public var headers: [String: String]
    public init(key: String, url: String, headers: [String: String]) {
        self.key = key
        self.url = url
        self.headers = headers
    }
}

/// What a finished job produced, as blob keys.
@BinaryMessage
public struct JobOutput: Codable, Sendable, Equatable {
    public var resultKey: String
    public var thumbnailKey: String
    public init(resultKey: String, thumbnailKey: String) {
        self.resultKey = resultKey
        self.thumbnailKey = thumbnailKey
    }
}
