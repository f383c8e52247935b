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

    /// Reads extra effects from JSON: a list of `EffectDescription`s.
    public static func parse(json: String) throws -> [EffectDescription] {
        let effects = try JSONDecoder().decode([EffectDescription].self, from: Data(json.utf8))
        for effect in effects where effect.processor == "remote" && effect.endpoint.flatMap(URL.init(string:)) == nil {
            throw BusError(.badRequest, "effect \(effect.id): a remote effect needs an endpoint URL")
        }
        return effects
    }

    /// The effect named `id` (or an alias of one).
    public func effect(_ id: String) -> EffectDescription? {
        effects[aliases[id] ?? id]
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
