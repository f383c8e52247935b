import Foundation

/// What the virtual users do: who they are, which flows they run and how often, and how long
/// they think between steps. The defaults are the app's usual day; `--config FILE` replaces any
/// of them from a small JSON file (fields left out keep their default).
struct Mix: Codable, Sendable {
    /// A kind of user and its share of sessions.
    struct Profile: Codable, Sendable {
        var name: String
        var weight: Double
        /// Signed in with a token (false: a guest with `X-Device-Id`).
        var signedIn: Bool = true
        /// The plan set through the admin route before the session (signed-in users only).
        var plan: String = "free"
        /// Edits started in one session: at least, at most.
        var jobs: [Int] = [1, 3]
    }

    /// How the session's steps are chosen (each a probability from 0 to 1).
    struct Flows: Codable, Sendable {
        /// Follows a job over the event stream rather than polling its status every 2 s.
        var sse: Double = 0.3
        /// Lists the history after the edits.
        var history: Double = 0.8
        /// Searches the history.
        var search: Double = 0.4
        /// Deletes one finished edit from the history.
        var delete: Double = 0.2
        /// Re-runs one finished edit from the history.
        var rerun: Double = 0.15
    }

    var profiles: [Profile] = [
        Profile(name: "free", weight: 55),
        Profile(name: "guest", weight: 20, signedIn: false),
        Profile(name: "pro", weight: 20, plan: "pro", jobs: [1, 4]),
        // Runs into the free daily limit (20) within one session.
        Profile(name: "heavy", weight: 5, jobs: [22, 22]),
    ]
    /// Effect id to weight.
    var effects: [String: Double] = ["copy": 4, "grayscale": 3, "auto-enhance": 2, "blur": 1]
    var flows = Flows()
    /// Seconds of thought between two steps: at least, at most.
    var thinkTime: [Double] = [0.5, 2.0]
    /// Seconds between two status polls, as the app does.
    var pollInterval: Double = 2.0
    /// Seconds a session follows one job before it moves on (the invariants still wait for it).
    var followTimeout: Double = 90
    /// Fixture images uploaded, by name: `small` (320×240), `medium` (640×480), `large` (1024×768).
    var images: [String] = ["small", "medium", "medium", "large"]

    enum CodingKeys: String, CodingKey { case profiles, effects, flows, thinkTime, pollInterval, followTimeout, images }

    init() {}

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Mix()
        profiles = try container.decodeIfPresent([Profile].self, forKey: .profiles) ?? defaults.profiles
        effects = try container.decodeIfPresent([String: Double].self, forKey: .effects) ?? defaults.effects
        flows = try container.decodeIfPresent(Flows.self, forKey: .flows) ?? defaults.flows
        thinkTime = try container.decodeIfPresent([Double].self, forKey: .thinkTime) ?? defaults.thinkTime
        pollInterval = try container.decodeIfPresent(Double.self, forKey: .pollInterval) ?? defaults.pollInterval
        followTimeout = try container.decodeIfPresent(Double.self, forKey: .followTimeout) ?? defaults.followTimeout
        images = try container.decodeIfPresent([String].self, forKey: .images) ?? defaults.images
    }

    /// Reads a mix from a JSON file; what it does not name keeps its default.
    static func load(_ path: String) throws -> Mix {
        let mix = try JSONDecoder().decode(Mix.self, from: Data(contentsOf: URL(fileURLWithPath: path)))
        try mix.validate()
        return mix
    }

    func validate() throws {
        guard !profiles.isEmpty, profiles.allSatisfy({ $0.weight >= 0 && $0.jobs.count == 2 && $0.jobs[0] >= 0 && $0.jobs[0] <= $0.jobs[1] && $0.jobs[1] <= 100 }),
              profiles.contains(where: { $0.weight > 0 }) else {
            throw UsageError("profiles: each needs a weight ≥ 0 and jobs [min, max] with 0 ≤ min ≤ max ≤ 100, and one weight > 0")
        }
        guard !effects.isEmpty, effects.values.allSatisfy({ $0 >= 0 }), effects.values.contains(where: { $0 > 0 }) else {
            throw UsageError("effects: at least one effect with a weight > 0")
        }
        guard thinkTime.count == 2, thinkTime[0] >= 0, thinkTime[0] <= thinkTime[1], thinkTime[1] <= 60 else {
            throw UsageError("thinkTime: [min, max] seconds, 0 ≤ min ≤ max ≤ 60")
        }
        guard pollInterval >= 0.1, pollInterval <= 60, followTimeout >= 1, followTimeout <= 3600 else {
            throw UsageError("pollInterval 0.1 to 60 s, followTimeout 1 to 3600 s")
        }
        guard !images.isEmpty, images.allSatisfy({ FixtureImages.sizes[$0] != nil }) else {
            throw UsageError("images: names among \(FixtureImages.sizes.keys.sorted().joined(separator: ", "))")
        }
        for probability in [flows.sse, flows.history, flows.search, flows.delete, flows.rerun] where !(0...1).contains(probability) {
            throw UsageError("flows: each a probability from 0 to 1")
        }
    }
}

/// A mistake in the command line or the config file.
struct UsageError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A random number generator that a seed makes repeatable (SplitMix64).
struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension RandomNumberGenerator {
    /// True with probability `p`.
    mutating func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &self) < p }

    /// One of `weights`' keys, picked in proportion to its weight.
    mutating func weighted<Key: Comparable>(_ weights: [Key: Double]) -> Key {
        let sorted = weights.filter { $0.value > 0 }.sorted { $0.key < $1.key }
        let total = sorted.reduce(0) { $0 + $1.value }
        var roll = Double.random(in: 0..<total, using: &self)
        for (key, weight) in sorted {
            if roll < weight { return key }
            roll -= weight
        }
        return sorted[sorted.count - 1].key
    }
}
