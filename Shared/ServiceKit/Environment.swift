import Bus
import Foundation
import Logging
import Synchronization

/// Reads configuration from environment variables, each with a default that runs on one machine.
public struct Environment: Sendable {
    /// Every variable, as given.
    public let values: [String: String]
    /// The names asked for, when `keysRead(by:)` records them.
    private let reads: Reads?

    /// The process's environment.
    public init() {
        values = ProcessInfo.processInfo.environment
        reads = nil
    }

    /// A given set of variables, for tests.
    public init(_ values: [String: String]) {
        self.values = values
        reads = nil
    }

    private init(_ values: [String: String], reads: Reads) {
        self.values = values
        self.reads = reads
    }

    private final class Reads: Sendable {
        let names = Mutex<Set<String>>([])
    }

    /// The variables `read` asks for of an environment holding `values` (whatever it throws):
    /// so that a configuration's list of its variables can be checked against what it reads.
    public static func keysRead(with values: [String: String] = [:], by read: (Environment) throws -> Void) -> Set<String> {
        let reads = Reads()
        _ = try? read(Environment(values, reads: reads))
        return reads.names.withLock { $0 }
    }

    /// The raw value of `key`, unset and empty alike nil.
    private func value(_ key: String) -> String? {
        _ = reads?.names.withLock { $0.insert(key) }
        guard let value = values[key], !value.isEmpty else { return nil }
        return value
    }

    /// The value of `key`, or `defaultValue` when it is unset or empty.
    public func string(_ key: String, default defaultValue: String) -> String {
        value(key) ?? defaultValue
    }

    /// The least severe log level printed (`LOG_LEVEL`, default `info`); every process reads it
    /// here.
    public func logLevel() throws -> Logger.Level {
        let text = string("LOG_LEVEL", default: "info")
        guard let level = Logger.Level(rawValue: text.lowercased()) else {
            throw ConfigurationError(key: "LOG_LEVEL", value: text, expected: "a log level (trace, debug, info, notice, warning, error, critical)")
        }
        return level
    }

    /// How log lines are written (`LOG_FORMAT`: `text`, the default, or `json`, one object a
    /// line); every process reads it here.
    public func logFormat() throws -> LogFormat {
        let text = string("LOG_FORMAT", default: "text")
        guard let format = LogFormat(rawValue: text.lowercased()) else {
            throw ConfigurationError(key: "LOG_FORMAT", value: text, expected: "text or json")
        }
        return format
    }

    /// How this process writes bus bodies (`BUS_ENCODING`: `binary`, the default, or `json`);
    /// every process reads it here and hands it to its bus clients and channels.
    public func busEncoding() throws -> BusEncoding {
        let text = string("BUS_ENCODING", default: "binary")
        guard let encoding = BusEncoding(name: text) else {
            throw ConfigurationError(key: "BUS_ENCODING", value: text, expected: "binary or json")
        }
        return encoding
    }

    /// The integer value of `key`, or `defaultValue` when unset; an unparsable value is an error.
    public func int(_ key: String, default defaultValue: Int) throws -> Int {
        guard let value = value(key) else { return defaultValue }
        guard let number = Int(value) else { throw ConfigurationError(key: key, value: value, expected: "an integer") }
        return number
    }

    /// The value of `key` as a boolean (`true`/`false`, `1`/`0`, `yes`/`no`), or `defaultValue`
    /// when unset or empty.
    public func bool(_ key: String, default defaultValue: Bool) throws -> Bool {
        guard let value = value(key)?.lowercased() else { return defaultValue }
        switch value {
        case "true", "1", "yes": return true
        case "false", "0", "no": return false
        default: throw ConfigurationError(key: key, value: value, expected: "true or false")
        }
    }

    /// The value of `key` or nil when unset or empty.
    public func optional(_ key: String) -> String? {
        value(key)
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
