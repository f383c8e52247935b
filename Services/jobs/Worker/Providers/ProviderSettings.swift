import Foundation
import ServiceKit

/// What a worker needs to call the model providers: their keys and base URLs, and how long a
/// model may take. Keys come only from the environment (never from a request or a job) and are
/// never printed: this type describes itself without them.
public struct ProviderSettings: Sendable {
    /// `GEMINI_API_KEY`, sent as `x-goog-api-key`.
    var geminiKey: String?
    /// `OPENAI_API_KEY`, sent as `Authorization: Bearer`.
    var openAIKey: String?
    /// `FAL_KEY`, sent as `Authorization: Key`.
    var falKey: String?
    /// The providers' base URLs (`GEMINI_BASE_URL`, `OPENAI_BASE_URL`, `FAL_QUEUE_URL`); an
    /// effect's `endpoint` overrides its provider's.
    var geminiBaseURL: String
    var openAIBaseURL: String
    var falQueueURL: String
    /// How long an image model may take (`WORKER_IMAGE_TIMEOUT_S`, 120) and a video model
    /// (`WORKER_VIDEO_TIMEOUT_S`, 1800), waits for rate limits included; an effect's
    /// `timeoutSeconds` overrides. Past it the attempt fails as retryable.
    var imageTimeout: Duration
    var videoTimeout: Duration
    /// How often a generation waiting in fal's queue is polled (`WORKER_POLL_MS`, 5000); fal's
    /// webhook makes the worker ask at once.
    var pollInterval: Duration
    /// The most generations this worker waits on without a slot (`WORKER_MAX_GENERATIONS`,
    /// 2000); past it a generation keeps its slot while it waits.
    var maxGenerations: Int

    public init(environment: Environment) throws {
        func key(_ name: String) -> String? { environment.optional(name).flatMap { $0.isEmpty ? nil : $0 } }
        geminiKey = key("GEMINI_API_KEY")
        openAIKey = key("OPENAI_API_KEY")
        falKey = key("FAL_KEY")
        geminiBaseURL = Self.trimmed(environment.string("GEMINI_BASE_URL", default: "https://generativelanguage.googleapis.com"))
        openAIBaseURL = Self.trimmed(environment.string("OPENAI_BASE_URL", default: "https://api.openai.com"))
        falQueueURL = Self.trimmed(environment.string("FAL_QUEUE_URL", default: "https://queue.fal.run"))
        imageTimeout = .seconds(max(1, try environment.int("WORKER_IMAGE_TIMEOUT_S", default: 120)))
        videoTimeout = .seconds(max(1, try environment.int("WORKER_VIDEO_TIMEOUT_S", default: 1800)))
        pollInterval = .milliseconds(max(50, try environment.int("WORKER_POLL_MS", default: 5000)))
        maxGenerations = max(0, try environment.int("WORKER_MAX_GENERATIONS", default: 2000))
    }

    public init(geminiKey: String? = nil, openAIKey: String? = nil, falKey: String? = nil,
                geminiBaseURL: String = "https://generativelanguage.googleapis.com", openAIBaseURL: String = "https://api.openai.com",
                falQueueURL: String = "https://queue.fal.run", imageTimeout: Duration = .seconds(120), videoTimeout: Duration = .seconds(1800),
                pollInterval: Duration = .seconds(5), maxGenerations: Int = 2000) {
        self.geminiKey = geminiKey
        self.openAIKey = openAIKey
        self.falKey = falKey
        self.geminiBaseURL = Self.trimmed(geminiBaseURL)
        self.openAIBaseURL = Self.trimmed(openAIBaseURL)
        self.falQueueURL = Self.trimmed(falQueueURL)
        self.imageTimeout = imageTimeout
        self.videoTimeout = videoTimeout
        self.pollInterval = pollInterval
        self.maxGenerations = maxGenerations
    }

    static func trimmed(_ url: String) -> String { url.hasSuffix("/") ? String(url.dropLast()) : url }

    public static let environmentKeys = [
        "GEMINI_API_KEY", "OPENAI_API_KEY", "FAL_KEY", "GEMINI_BASE_URL", "OPENAI_BASE_URL", "FAL_QUEUE_URL",
        "WORKER_IMAGE_TIMEOUT_S", "WORKER_VIDEO_TIMEOUT_S", "WORKER_POLL_MS", "WORKER_MAX_GENERATIONS",
    ]
}

extension ProviderSettings: CustomStringConvertible {
    /// Which keys are set, never what they are.
    public var description: String {
        "ProviderSettings(gemini: \(geminiKey == nil ? "no key" : "key set"), openai: \(openAIKey == nil ? "no key" : "key set"), fal: \(falKey == nil ? "no key" : "key set"))"
    }
}
