import Blobs
import Foundation
import JobsCore
import Messages
import ServiceKit
import Storage

/// What the jobs service reads beyond every service's settings.
public struct JobsConfiguration: Sendable {
    /// Where workers connect (`JOBS_WORKER_BIND`, default `tcp://127.0.0.1:7104`).
    public var workerEndpoint: String
    /// The database file (`JOBS_DB`, default `$DATA_DIR/jobs.sqlite`).
    public var databasePath: String
    /// PostgreSQL instead of the file (`JOBS_DATABASE_URL`, `postgres://user:password@host:port/db`):
    /// any number of jobs replicas then serve the same jobs, one of them (elected) dispatching.
    public var databaseURL: PostgresLocation?
    /// Effects beyond the built-in ones (`JOBS_EFFECTS`, JSON list).
    public var extraEffects: [EffectDescription]
    /// Attempts before a retryable failure is final (`JOBS_MAX_ATTEMPTS`, 3) and the first
    /// backoff (`JOBS_RETRY_BASE_MS`, 1000; doubling, capped at a minute).
    public var retry: RetryPolicy
    /// Whether PRO users' jobs go first (`JOBS_PRO_FIRST`, true).
    public var proFirst: Bool
    /// How long a lost worker's generations at a provider wait for it to reconnect before they
    /// are queued again (`JOBS_LOST_WORKER_GRACE_S`, 30; 0: at once).
    public var lostWorkerGrace: Duration
    /// Jobs queued at most before `create` answers `jobs.queue_full` (`JOBS_MAX_QUEUED`, 100,000).
    public var maxQueued: Int
    /// The quota service, for settlements (`QUOTA_ENDPOINT`).
    public var quotaEndpoint: String
    /// The history service, for job events (`HISTORY_ENDPOINT`).
    public var historyEndpoint: String
    /// The blob store (`BLOB_STORE` and its settings): where purged jobs' files are deleted, and
    /// whose presigned URLs the workers are given.
    public var blobs: BlobStoreConfiguration
    /// How long a worker's presigned URLs stay valid (`JOBS_TRANSFER_TTL_S`, default 3600).
    public var transferLifetime: Int
    /// Uploads no job used are removed once this old (`JOBS_UNUSED_UPLOAD_TTL_S`, default a day),
    /// checked every `JOBS_UPLOAD_SWEEP_MS` (default an hour).
    public var unusedUploadAge: Int
    public var uploadSweepInterval: Duration
    /// The most jobs of each provider held by workers at once (`JOBS_PROVIDER_CONCURRENCY`, JSON
    /// such as `{"gemini": 8, "openai": 4, "fal": 16}`; a provider not named has no limit).
    public var providerLimits: [String: Int]
    /// Push notifications when a job ends (`APNS_*`, `FCM_*`, `PUSH_CA_FILE`): see `PushSettings`.
    public var push: PushSettings

    public init(environment: Environment, dataDirectory: String) throws {
        workerEndpoint = environment.string("JOBS_WORKER_BIND", default: "tcp://127.0.0.1:7104")
        databasePath = environment.string("JOBS_DB", default: dataDirectory + "/jobs.sqlite")
        databaseURL = try environment.optional("JOBS_DATABASE_URL").map { try PostgresLocation(variable: "JOBS_DATABASE_URL", url: $0) }
        if let json = environment.optional("JOBS_EFFECTS") {
            do {
                extraEffects = try EffectCatalog.parse(json: json)
            } catch {
                throw ConfigurationError(key: "JOBS_EFFECTS", value: json, expected: "a JSON list of effects (\(error))")
            }
        } else {
            extraEffects = []
        }
        let retryDefaults = RetryPolicy()
        retry = RetryPolicy(
            maxAttempts: max(1, try environment.int("JOBS_MAX_ATTEMPTS", default: retryDefaults.maxAttempts)),
            baseDelay: .milliseconds(max(1, try environment.int("JOBS_RETRY_BASE_MS", default: Int(retryDefaults.baseDelay / .milliseconds(1)))))
        )
        proFirst = environment.string("JOBS_PRO_FIRST", default: "true") != "false"
        lostWorkerGrace = .seconds(max(0, try environment.int("JOBS_LOST_WORKER_GRACE_S", default: 30)))
        maxQueued = try environment.int("JOBS_MAX_QUEUED", default: 100_000)
        quotaEndpoint = environment.string(ServiceName.quota.endpointVariable, default: ServiceName.quota.defaultEndpoint)
        historyEndpoint = environment.string(ServiceName.history.endpointVariable, default: ServiceName.history.defaultEndpoint)
        // The URLs jobs signs are its workers' (`WORKER_BASE_URL`, `S3_WORKER_ENDPOINT`).
        blobs = try BlobStoreConfiguration(audience: .workers) { key in key == "DATA_DIR" ? dataDirectory : environment.optional(key) }
        transferLifetime = min(604_800, max(3, try environment.int("JOBS_TRANSFER_TTL_S", default: 3600)))
        unusedUploadAge = max(1, try environment.int("JOBS_UNUSED_UPLOAD_TTL_S", default: 86_400))
        uploadSweepInterval = .milliseconds(max(100, try environment.int("JOBS_UPLOAD_SWEEP_MS", default: 3_600_000)))
        push = try PushSettings(environment: environment)
        if let json = environment.optional("JOBS_PROVIDER_CONCURRENCY") {
            guard let limits = try? JSONDecoder().decode([String: Int].self, from: Data(json.utf8)), limits.values.allSatisfy({ $0 >= 1 }) else {
                throw ConfigurationError(key: "JOBS_PROVIDER_CONCURRENCY", value: json, expected: "a JSON object of provider to a limit of at least 1")
            }
            providerLimits = limits
        } else {
            providerLimits = [:]
        }
    }

    /// The variables `init(environment:dataDirectory:)` reads.
    public static let environmentKeys = [
        "JOBS_WORKER_BIND", "JOBS_DB", "JOBS_DATABASE_URL", "JOBS_EFFECTS", "JOBS_MAX_ATTEMPTS", "JOBS_RETRY_BASE_MS",
        "JOBS_PRO_FIRST", "JOBS_MAX_QUEUED", "QUOTA_ENDPOINT", "HISTORY_ENDPOINT", "JOBS_TRANSFER_TTL_S",
        "JOBS_UNUSED_UPLOAD_TTL_S", "JOBS_UPLOAD_SWEEP_MS", "JOBS_PROVIDER_CONCURRENCY", "JOBS_LOST_WORKER_GRACE_S",
    ] + BlobStoreConfiguration.environmentKeys(for: .workers) + PushSettings.environmentKeys
}
