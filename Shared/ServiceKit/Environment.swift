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

    /// The process's environment, with the variables given as files (`loadFiles`).
    public init() {
        let files = Self.files.withLock { $0 }
        values = ProcessInfo.processInfo.environment.merging(files) { given, file in given.isEmpty ? file : given }
        reads = nil
    }

    /// The variables given as files (`NAME_FILE=/path`, as Docker and Kubernetes mount secrets):
    /// each file's text, less a trailing newline, is `NAME`'s value, unless `NAME` itself is set
    /// and not empty. Read once by `loadFiles`.
    private static let files = Mutex<[String: String]>([:])

    /// The variables that may be given as files: the secrets and what goes with them. (Only
    /// these: any `_FILE` of the environment would be read otherwise, `TF_CLI_CONFIG_FILE` and
    /// the like.)
    public static let fileKeys = [
        "JWT_SECRET", "ADMIN_TOKEN", "VIEWER_TOKEN", "URL_SIGNING_SECRET", "ADAPTY_WEBHOOK_SECRET",
        "BUS_CURVE_SECRET", "BUS_CURVE_PUBLIC", "BUS_CURVE_KEY", "BUS_CURVE_CLIENTS",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "QUOTA_DATABASE_URL", "HISTORY_DATABASE_URL", "JOBS_DATABASE_URL",
        "GEMINI_API_KEY", "OPENAI_API_KEY", "FAL_KEY",
    ]

    /// Reads the `NAME_FILE` of each of `fileKeys` the environment sets (see `files`). A process's main calls
    /// it first, on the main thread, before any task runs: it reads files, which is never done on
    /// the cooperative pool. The failure is an unreadable file, named by its variable (never its
    /// contents); `ProcessExit.run` reports it.
    public static func loadFiles() -> Result<Void, ConfigurationError> {
        var read: [String: String] = [:]
        let environment = ProcessInfo.processInfo.environment
        for name in fileKeys {
            guard let path = environment[name + "_FILE"], !path.isEmpty else { continue }
            guard let data = FileManager.default.contents(atPath: path), var text = String(data: data, encoding: .utf8) else {
                return .failure(ConfigurationError(key: name + "_FILE", value: path, expected: "a readable UTF-8 file holding \(name)'s value"))
            }
            while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
            read[name] = text
        }
        files.withLock { $0 = read }
        return .success(())
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
