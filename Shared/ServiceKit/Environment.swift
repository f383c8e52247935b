import Foundation

/// Reads configuration from environment variables, each with a default that runs on one machine.
public struct Environment: Sendable {
    /// Every variable, as given.
    public let values: [String: String]

    /// The process's environment.
    public init() { values = ProcessInfo.processInfo.environment }

    /// A given set of variables, for tests.
    public init(_ values: [String: String]) { self.values = values }

    /// The value of `key`, or `defaultValue` when it is unset or empty.
    public func string(_ key: String, default defaultValue: String) -> String {
        guard let value = values[key], !value.isEmpty else { return defaultValue }
        return value
    }

    /// The integer value of `key`, or `defaultValue` when unset; an unparsable value is an error.
    public func int(_ key: String, default defaultValue: Int) throws -> Int {
        guard let value = values[key], !value.isEmpty else { return defaultValue }
        guard let number = Int(value) else { throw ConfigurationError(key: key, value: value, expected: "an integer") }
        return number
    }

    /// The value of `key` as a boolean (`true`/`false`, `1`/`0`, `yes`/`no`), or `defaultValue`
    /// when unset or empty.
    public func bool(_ key: String, default defaultValue: Bool) throws -> Bool {
        guard let value = values[key]?.lowercased(), !value.isEmpty else { return defaultValue }
        switch value {
        case "true", "1", "yes": return true
        case "false", "0", "no": return false
        default: throw ConfigurationError(key: key, value: value, expected: "true or false")
        }
    }

    /// The value of `key` or nil when unset or empty.
    public func optional(_ key: String) -> String? {
        guard let value = values[key], !value.isEmpty else { return nil }
        return value
    }
}

/// A configuration variable that has a value of the wrong form.
public struct ConfigurationError: Error, CustomStringConvertible {
    public var key: String
    public var value: String
    public var expected: String

    public init(key: String, value: String, expected: String) {
        self.key = key
        self.value = value
        self.expected = expected
    }

    public var description: String { "\(key)=\(value) is not \(expected)" }
}
