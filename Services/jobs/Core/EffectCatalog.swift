import Foundation
import Messages

/// The effects workers run: built-in libvips effects, plus any an operator configures (such as a
/// remote inference endpoint). Validates a request's parameters against an effect's schema.
public struct EffectCatalog: Sendable {
    public private(set) var effects: [String: EffectDescription]
    /// Older names the app still sends (`model: "default"`).
    public let aliases: [String: String]

    public static let builtIn: [EffectDescription] = [
        EffectDescription(id: "grayscale", title: "Black & White"),
        EffectDescription(id: "blur", title: "Soft Focus", parameters: [.init(name: "sigma", minimum: 0.1, maximum: 50, defaultValue: 2)]),
        EffectDescription(id: "sharpen", title: "Sharpen", parameters: [.init(name: "sigma", minimum: 0.1, maximum: 10, defaultValue: 1)]),
        EffectDescription(id: "upscale", title: "Upscale", parameters: [.init(name: "factor", minimum: 1, maximum: 4, defaultValue: 2)]),
        EffectDescription(id: "auto-enhance", title: "Auto Enhance", parameters: [
            .init(name: "fidelity", minimum: 0, maximum: 1, defaultValue: 1),
            .init(name: "upscale", minimum: 1, maximum: 4, defaultValue: 1),
        ]),
        EffectDescription(id: "copy", title: "Original", processor: "copy"),
    ]

    public init(extra: [EffectDescription] = []) {
        var effects: [String: EffectDescription] = [:]
        for effect in Self.builtIn + extra { effects[effect.id] = effect }
        self.effects = effects
        self.aliases = ["default": "auto-enhance"]
    }

    /// The processors a worker knows: libvips and copy built in, the providers' adapters, the
    /// operator's own endpoint, and `noop` (for benchmarks of the queue).
    public static let processors: Set<String> = ["vips", "copy", "remote", "gemini", "openai", "fal", "noop"]
    /// The processors that call a model provider, each with its adapter.
    public static let providers: Set<String> = ["gemini", "openai", "fal"]

    /// Reads extra effects from JSON: a list of `EffectDescription`s. An effect with the id of a
    /// built-in one replaces it (to change its price); one with the id `default` is what the app's
    /// `model: "default"` runs (otherwise `auto-enhance`).
    public static func parse(json: String) throws -> [EffectDescription] {
        let effects = try JSONDecoder().decode([EffectDescription].self, from: Data(json.utf8))
        for effect in effects {
            guard (1...256).contains(effect.id.utf8.count) else { throw BusError(.badRequest, "an effect id must be 1 to 256 bytes") }
            guard processors.contains(effect.processor) else {
                throw BusError(.badRequest, "effect \(effect.id): processor must be one of \(processors.sorted().joined(separator: ", "))")
            }
            guard (1...1000).contains(effect.credits) else { throw BusError(.badRequest, "effect \(effect.id): credits must be 1 to 1000") }
            if let timeout = effect.timeoutSeconds, !(1...86_400).contains(timeout) {
                throw BusError(.badRequest, "effect \(effect.id): timeoutSeconds must be 1 to 86400")
            }
            if effect.processor == "remote", effect.endpoint.flatMap(URL.init(string:)) == nil {
                throw BusError(.badRequest, "effect \(effect.id): a remote effect needs an endpoint URL")
            }
            if providers.contains(effect.processor), (effect.model ?? "").isEmpty {
                throw BusError(.badRequest, "effect \(effect.id): a \(effect.processor) effect names the provider's model id in model")
            }
            if let endpoint = effect.endpoint, URL(string: endpoint)?.scheme == nil {
                throw BusError(.badRequest, "effect \(effect.id): endpoint must be an absolute URL")
            }
        }
        return effects
    }

    /// The effect named `id` (or an alias of one, unless an effect has that id itself).
    public func effect(_ id: String) -> EffectDescription? {
        effects[id] ?? aliases[id].flatMap { effects[$0] }
    }

    /// The provider an effect's jobs call (for the per-provider concurrency limit), nil for
    /// those that call none.
    public func provider(of effectId: String) -> String? {
        effect(effectId).map(\.processor).flatMap { Self.providers.contains($0) || $0 == "remote" ? $0 : nil }
    }

    /// The effect and its full parameters (defaults filled in), or a typed error.
    public func resolve(_ id: String, parameters: [String: Double]) throws(BusError) -> (EffectDescription, [String: Double]) {
        guard let effect = effect(id) else {
            throw BusError(Jobs.ErrorCode.unknownEffect, "no effect '\(id.prefix(64))'; effects: \(effects.keys.sorted().joined(separator: ", "))")
        }
        var resolved: [String: Double] = [:]
        let known = Dictionary(uniqueKeysWithValues: effect.parameters.map { ($0.name, $0) })
        for name in parameters.keys where known[name] == nil {
            throw BusError(Jobs.ErrorCode.invalidParameters, "\(effect.id) has no parameter '\(name.prefix(64))'")
        }
        for parameter in effect.parameters {
            let value = parameters[parameter.name] ?? parameter.defaultValue
            guard value.isFinite, (parameter.minimum...parameter.maximum).contains(value) else {
                throw BusError(Jobs.ErrorCode.invalidParameters, "\(parameter.name) must be \(parameter.minimum) to \(parameter.maximum)")
            }
            resolved[parameter.name] = value
        }
        return (effect, resolved)
    }
}

/// When a retryable failure is tried again: exponential, capped.
public struct RetryPolicy: Sendable, Equatable {
    public var maxAttempts: Int
    public var baseDelay: Duration
    public var maxDelay: Duration

    public init(maxAttempts: Int = 3, baseDelay: Duration = .seconds(1), maxDelay: Duration = .seconds(60)) {
        self.maxAttempts = maxAttempts
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
    }

    /// The wait before attempt `attempt + 1` after attempt `attempt` failed.
    public func delay(after attempt: Int) -> Duration {
        let factor = 1 << min(max(attempt - 1, 0), 20)
        return min(baseDelay * factor, maxDelay)
    }
}
