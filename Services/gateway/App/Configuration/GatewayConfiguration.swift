import AppAttest
import Blobs
import Bus
import Foundation
import Logging
import Messages
import ServiceKit

/// What the gateway reads from the environment.
public struct GatewayConfiguration: Sendable {
    /// The address to listen on (`GATEWAY_HOST`, default `127.0.0.1`).
    public var host: String
    /// The port to listen on (`GATEWAY_PORT`, default 8080; 0 picks a free one).
    public var port: Int
    /// Each service's endpoint (`QUOTA_ENDPOINT`, `HISTORY_ENDPOINT`, `JOBS_ENDPOINT`).
    public var endpoints: [ServiceName: String]
    /// The deadline of a bus call (`BUS_TIMEOUT_MS`, default 5000).
    public var busTimeout: Duration
    /// The deadline of each `health` call made by `/readyz` (`READY_TIMEOUT_MS`, default 500).
    public var readinessTimeout: Duration
    /// The least severe log level printed (`LOG_LEVEL`, default `info`).
    public var logLevel: Logger.Level
    /// How log lines are written (`LOG_FORMAT`: `text`, the default, or `json`).
    public var logFormat: LogFormat
    /// The HS256 secret of user tokens (`JWT_SECRET`); none refuses every bearer token.
    public var jwtSecret: String?
    /// The admin routes' bearer token (`ADMIN_TOKEN`); none refuses every admin call.
    public var adminToken: String?
    /// The read-only admin token (`VIEWER_TOKEN`): reads every admin route, acts on none (403).
    public var viewerToken: String?
    /// The blob store (`BLOB_STORE`: `folder`, in `BLOB_DIR`, or `s3`, with the `S3_*` and
    /// `AWS_*` settings).
    public var blobStore: BlobStoreConfiguration.Store
    /// The key of upload and download URL signatures (`URL_SIGNING_SECRET`).
    public var urlSigningSecret: String
    /// The gateway's address as clients reach it, for signed URLs (`PUBLIC_BASE_URL`).
    public var publicBaseURL: String
    /// `PUBLIC_BASE_URL` is unset and the gateway listens on every interface: the signed URLs'
    /// 127.0.0.1 reaches only this machine.
    public var publicBaseURLGuessed: Bool
    /// The largest upload (`UPLOAD_MAX_BYTES`, default 20 MiB) and how long an upload or
    /// download URL stays valid (`SIGNED_URL_TTL_S`, default 900).
    public var uploadMaxBytes: Int
    public var signedURLLifetime: Int
    /// How long a history share link works (`SHARE_TTL_S`, default 7 days).
    public var shareLifetime: Int
    /// How long an `Idempotency-Key` names its job (`IDEMPOTENCY_WINDOW_S`, default a day, as
    /// quota remembers a charge): sent again later, it is refused (409 `idempotency_key_expired`).
    public var idempotencyWindow: Int
    /// The most pixels an uploaded image may have, read from its header (`IMAGE_MAX_PIXELS`,
    /// default 50 megapixels).
    public var imageMaxPixels: Int
    /// Open job event streams: at most `streamsPerUser` a user (`SSE_MAX_PER_USER`, default 8)
    /// and `streamsTotal` in all (`SSE_MAX_STREAMS`, default 4,000); past either, 503.
    public var streamsPerUser: Int
    public var streamsTotal: Int
    /// How often every open event stream gets a comment line (`: keepalive`), so that proxies and
    /// clients that close idle connections keep it (`SSE_KEEPALIVE_S`, default 15 s, at least 1).
    public var streamKeepalive: Duration
    /// Whether a presign is refused with the quota 429 when the user has no edit left in some
    /// window (`UPLOADS_REQUIRE_QUOTA`, default true).
    public var uploadsRequireQuota: Bool
    /// The `Authorization` header value Adapty's webhook sends (`ADAPTY_WEBHOOK_SECRET`); none:
    /// `POST /webhooks/adapty` answers 404.
    public var adaptyWebhookSecret: String?
    /// Where fal's webhook keys are (`FAL_WEBHOOK_JWKS_URL`, default fal's own,
    /// `https://rest.alpha.fal.ai/.well-known/jwks.json`): see `FalWebhookSignature`.
    public var falWebhookJWKSURL: String
    /// Where the OpenAPI document is (`OPENAPI_FILE`; by default `openapi.yaml` in the working
    /// folder or the repo root above the executable).
    public var openAPIFile: String?
    /// What a client may hold of the gateway (`HTTP_IDLE_TIMEOUT_S`, 60; `HTTP_BODY_MIN_BYTES_PER_S`,
    /// 1024; `HTTP_BODY_GRACE_S`, 10; `HTTP_MAX_CONNECTIONS`, 10,000): see `ClientLimits`.
    public var clientLimits: ClientLimits
    /// The proxies whose `X-Forwarded-For` is believed (`TRUSTED_PROXIES`, CIDRs): see `ClientNetworks`.
    public var clientNetworks: ClientNetworks
    /// CURVE keys for the bus (`BUS_CURVE_PUBLIC`); nil for plain traffic.
    public var curve: CurveClientKeys?
    /// How its bus calls write bodies (`BUS_ENCODING`, default binary).
    public var busEncoding: BusEncoding
    /// Whether Swift's tasks run on the HTTP event loops instead of Swift's own thread pool
    /// (`GATEWAY_TASKS_ON_EVENT_LOOPS`, default false), so that a request's handler, its bus
    /// calls (`EventLoopLane`) and its response stay on the loop that read it. Off by default: on
    /// a 2-core machine it measured slower (docs/bus.md). Read by the gateway's main before any
    /// task starts.
    public var tasksOnEventLoops: Bool
    /// Apple App Attest at guest sign-up (`APP_ATTEST_APP_ID`, `APP_ATTEST_ENVIRONMENT`,
    /// `APP_ATTEST_REQUIRED`); nil: off. See `AttestationController`.
    public var appAttest: AppAttestSettings?

    /// Reads the configuration from `environment`: every default is written here, once. A
    /// malformed value throws a `ConfigurationError` naming its variable.
    public init(environment: Environment) throws {
        host = environment.string("GATEWAY_HOST", default: SharedDefaults.gatewayHost)
        port = try environment.int("GATEWAY_PORT", default: SharedDefaults.gatewayPort)
        endpoints = Dictionary(uniqueKeysWithValues: ServiceName.allCases.map {
            ($0, environment.string($0.endpointVariable, default: $0.defaultEndpoint))
        })
        busTimeout = .milliseconds(try environment.int("BUS_TIMEOUT_MS", default: 5000))
        readinessTimeout = .milliseconds(try environment.int("READY_TIMEOUT_MS", default: 500))
        logLevel = try environment.logLevel()
        logFormat = try environment.logFormat()
        jwtSecret = environment.optional("JWT_SECRET")
        adminToken = environment.optional("ADMIN_TOKEN")
        viewerToken = environment.optional("VIEWER_TOKEN")
        let blobs = try BlobStoreConfiguration(value: environment.optional)
        blobStore = blobs.store
        urlSigningSecret = blobs.urlSigningSecret
        // Unset: the address the gateway listens on, as clients would reach it; on every interface
        // (0.0.0.0, ::) there is no such name, and loopback stands in (logged at start).
        let guess = SharedDefaults.publicBaseURL(host: host, port: port)
        publicBaseURL = environment.optional("PUBLIC_BASE_URL") ?? guess.url
        publicBaseURLGuessed = environment.optional("PUBLIC_BASE_URL") == nil && guess.guessed
        uploadMaxBytes = try environment.int("UPLOAD_MAX_BYTES", default: 20 << 20)
        signedURLLifetime = try environment.int("SIGNED_URL_TTL_S", default: 900)
        shareLifetime = try environment.int("SHARE_TTL_S", default: 7 * 86_400)
        idempotencyWindow = max(1, try environment.int("IDEMPOTENCY_WINDOW_S", default: 86_400))
        imageMaxPixels = try environment.int("IMAGE_MAX_PIXELS", default: 50_000_000)
        streamsPerUser = try environment.int("SSE_MAX_PER_USER", default: 8)
        streamsTotal = try environment.int("SSE_MAX_STREAMS", default: 4_000)
        streamKeepalive = .seconds(max(1, try environment.int("SSE_KEEPALIVE_S", default: 15)))
        uploadsRequireQuota = try environment.bool("UPLOADS_REQUIRE_QUOTA", default: true)
        adaptyWebhookSecret = environment.optional("ADAPTY_WEBHOOK_SECRET")
        falWebhookJWKSURL = environment.string("FAL_WEBHOOK_JWKS_URL", default: FalWebhookSignature.defaultJWKSURL)
        openAPIFile = environment.optional("OPENAPI_FILE")
        curve = try BusSecurity.clientKeys(environment)
        busEncoding = try environment.busEncoding()
        tasksOnEventLoops = try environment.bool("GATEWAY_TASKS_ON_EVENT_LOOPS", default: false)
        clientNetworks = try ClientNetworks(trustedProxies: environment.optional("TRUSTED_PROXIES"))
        appAttest = try AppAttestSettings(environment: environment)
        clientLimits = ClientLimits(
            idleTimeout: .seconds(max(1, try environment.int("HTTP_IDLE_TIMEOUT_S", default: 60))),
            minimumBodyRate: max(0, try environment.int("HTTP_BODY_MIN_BYTES_PER_S", default: 1024)),
            bodyGrace: .seconds(max(1, try environment.int("HTTP_BODY_GRACE_S", default: 10))),
            maxConnections: max(1, try environment.int("HTTP_MAX_CONNECTIONS", default: 10_000))
        )
    }

    /// The environment variables `init(environment:)` reads.
    public static var environmentKeys: [String] {
        ["GATEWAY_HOST", "GATEWAY_PORT", "BUS_TIMEOUT_MS", "READY_TIMEOUT_MS", "LOG_LEVEL", "LOG_FORMAT", "JWT_SECRET", "ADMIN_TOKEN", "VIEWER_TOKEN",
         "UPLOAD_MAX_BYTES", "SIGNED_URL_TTL_S", "SHARE_TTL_S", "IDEMPOTENCY_WINDOW_S",
         "IMAGE_MAX_PIXELS", "SSE_MAX_PER_USER", "SSE_MAX_STREAMS", "SSE_KEEPALIVE_S", "UPLOADS_REQUIRE_QUOTA", "ADAPTY_WEBHOOK_SECRET", "FAL_WEBHOOK_JWKS_URL", "OPENAPI_FILE", "BUS_CURVE_PUBLIC", "BUS_CURVE_KEY", "BUS_ENCODING",
         "GATEWAY_TASKS_ON_EVENT_LOOPS",
         "HTTP_IDLE_TIMEOUT_S", "HTTP_BODY_MIN_BYTES_PER_S", "HTTP_BODY_GRACE_S", "HTTP_MAX_CONNECTIONS", "TRUSTED_PROXIES",
         "APP_ATTEST_APP_ID", "APP_ATTEST_ENVIRONMENT", "APP_ATTEST_REQUIRED"]
            + ServiceName.allCases.map(\.endpointVariable) + BlobStoreConfiguration.environmentKeys(for: .apps)
    }

    /// The blob store's settings, with the secret and base URL of the folder store's routes.
    public var blobs: BlobStoreConfiguration {
        BlobStoreConfiguration(store: blobStore, urlSigningSecret: urlSigningSecret, publicBaseURL: publicBaseURL)
    }
}

/// Apple App Attest at guest sign-up: which app's attestations are accepted, from which App Attest
/// environment, and whether a guest must be attested before anything else.
public struct AppAttestSettings: Sendable {
    /// The App ID attestations must be for: team id, a dot, bundle id (`APP_ATTEST_APP_ID`).
    public var appId: String
    /// `production` (the App Store and TestFlight; the default) or `development` (builds from
    /// Xcode) (`APP_ATTEST_ENVIRONMENT`).
    public var environment: AppAttestVerifier.Environment
    /// Whether only attested guests are admitted (`APP_ATTEST_REQUIRED`, default false): an
    /// unattested guest's requests then answer 403 `attestation_required`.
    public var required: Bool

    public init(appId: String, environment: AppAttestVerifier.Environment = .production, required: Bool = false) {
        self.appId = appId
        self.environment = environment
        self.required = required
    }

    /// The settings of `environment`; nil without `APP_ATTEST_APP_ID`.
    init?(environment: Environment) throws {
        guard let appId = environment.optional("APP_ATTEST_APP_ID") else { return nil }
        let parts = appId.split(separator: ".", maxSplits: 1)
        guard parts.count == 2, parts[0].count == 10, parts[0].allSatisfy({ $0.isLetter || $0.isNumber }) else {
            throw ConfigurationError(key: "APP_ATTEST_APP_ID", value: appId, expected: "TEAMID.bundle.id (a 10-character team id, a dot, the bundle id)")
        }
        let environmentText = environment.string("APP_ATTEST_ENVIRONMENT", default: "production")
        guard let attestEnvironment = AppAttestVerifier.Environment(rawValue: environmentText) else {
            throw ConfigurationError(key: "APP_ATTEST_ENVIRONMENT", value: environmentText, expected: "production or development")
        }
        self.init(appId: appId, environment: attestEnvironment, required: try environment.bool("APP_ATTEST_REQUIRED", default: false))
    }
}
