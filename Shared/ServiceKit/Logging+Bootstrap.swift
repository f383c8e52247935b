#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Bus
import Logging
import Synchronization

/// Process-wide logging: one line per event on standard output, labelled with the process's name,
/// metadata as `key=value` (request ids among them).
public enum ProcessLogging {
    /// Installs the log handler; call once, first thing in `main`. Each line's label names the
    /// process (`quota`, `worker-2`), and the logger within it when that is another
    /// (`gateway/Hummingbird`), so lines of several processes on one terminal tell whose they are
    /// without a filter in between.
    ///
    /// `format` `.json` writes each event as one JSON object a line (`LOG_FORMAT=json`), for Loki,
    /// Vector or a cloud log service: `time` (UTC, milliseconds), `level`, `process`, `logger`,
    /// `message`, `request_id` and `trace_id` when the event has them, `source`, and the rest of
    /// the metadata under `metadata`.
    ///
    /// When the process traces, each line written inside a span carries `trace-id` and `span-id`
    /// (`trace_id` and `span_id` in JSON), so a log service links it to the trace.
    public static func bootstrap(level: Logger.Level, process: String? = nil, format: LogFormat = .text) {
        LoggingSystem.bootstrap({ label, provider in
            var handler = ProcessLogHandler(label: process.map { $0 == label ? label : "\($0)/\(label)" } ?? label, level: level)
            handler.format = format
            handler.process = process ?? label
            handler.logger = label
            handler.metadataProvider = provider
            return handler
        }, metadataProvider: traceContext)
    }

    /// The current span's ids, read only for lines that are written, and only when the process
    /// traces.
    static let traceContext = Logger.MetadataProvider {
        let traceParent = BusTracing.currentTraceParent()
        // `00-<32 hex trace id>-<16 hex span id>-<flags>`
        let parts = traceParent.split(separator: "-")
        guard parts.count == 4, parts[1].count == 32, parts[2].count == 16 else { return [:] }
        return ["trace-id": "\(parts[1])", "span-id": "\(parts[2])"]
    }
}

/// How log lines are written (`LOG_FORMAT`).
public enum LogFormat: String, Sendable, CaseIterable {
    /// `2026-11-22T14:01:21+0000 info quota: key=value [source] message`, for a terminal.
    case text
    /// One JSON object a line, for a log shipper.
    case json
}

/// swift-log's `StreamLogHandler` line format (`2026-11-22T14:01:21+0000 info quota: key=value
/// [source] message`), but metadata is formatted only when a line is written. StreamLogHandler
/// formats it again on every change, and every HTTP request sets some (its id): in the gateway's
/// profile that was 5 % of the CPU, for lines that at `warning` are never written.
public struct ProcessLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    /// Text lines or JSON objects.
    public var format: LogFormat = .text
    /// The process's name and the logger's label, the JSON lines' `process` and `logger`.
    var process = ""
    var logger = ""
    private let label: String
    /// Serialises whole lines from every thread of the process.
    private static let output = Mutex(())

    public init(label: String, level: Logger.Level) {
        self.label = label
        self.logLevel = level
        self.metadataProvider = LoggingSystem.metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty { all.merge(provided) { _, new in new } }
        if let explicit = event.metadata, !explicit.isEmpty { all.merge(explicit) { _, new in new } }
        let text: String
        switch format {
        case .text:
            let fields = all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            text = "\(Self.timestamp()) \(event.level) \(label):\(fields) [\(event.source)] \(event.message)\n"
        case .json:
            text = jsonLine(event: event, metadata: all)
        }
        var bytes = Array(text.utf8)
        Self.output.withLock { _ in
            // One write per line (atomic on a pipe up to PIPE_BUF), the rest if it was cut short.
            bytes.withUnsafeMutableBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    let written = write(STDOUT_FILENO, buffer.baseAddress! + offset, buffer.count - offset)
                    if written > 0 { offset += written } else if errno != EINTR { break }
                }
            }
        }
    }

    private static func timestamp() -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

// MARK: - JSON lines

extension ProcessLogHandler {
    /// The metadata keys lifted to the top of a JSON line, and the names they take there.
    private static let lifted = [("request-id", "request_id"), ("trace-id", "trace_id"), ("span-id", "span_id")]

    func jsonLine(event: LogEvent, metadata: Logger.Metadata) -> String {
        var metadata = metadata
        var line = "{\"time\":"
        Self.appendJSON(string: Self.utcTimestamp(), to: &line)
        line += ",\"level\":\"\(event.level.rawValue)\",\"process\":"
        Self.appendJSON(string: process, to: &line)
        line += ",\"logger\":"
        Self.appendJSON(string: logger, to: &line)
        line += ",\"message\":"
        Self.appendJSON(string: event.message.description, to: &line)
        for (key, name) in Self.lifted {
            guard let value = metadata.removeValue(forKey: key) else { continue }
            line += ",\"\(name)\":"
            Self.appendJSON(string: value.description, to: &line)
        }
        line += ",\"source\":"
        Self.appendJSON(string: event.source, to: &line)
        if !metadata.isEmpty {
            line += ",\"metadata\":"
            Self.appendJSON(value: .dictionary(metadata), to: &line)
        }
        line += "}\n"
        return line
    }

    /// A metadata value as JSON: strings as strings, arrays and dictionaries (keys sorted) as such.
    private static func appendJSON(value: Logger.MetadataValue, to line: inout String) {
        switch value {
        case .string(let text): appendJSON(string: text, to: &line)
        case .stringConvertible(let convertible): appendJSON(string: convertible.description, to: &line)
        case .array(let values):
            line += "["
            for (index, element) in values.enumerated() {
                if index > 0 { line += "," }
                appendJSON(value: element, to: &line)
            }
            line += "]"
        case .dictionary(let dictionary):
            line += "{"
            for (index, key) in dictionary.keys.sorted().enumerated() {
                if index > 0 { line += "," }
                appendJSON(string: key, to: &line)
                line += ":"
                appendJSON(value: dictionary[key]!, to: &line)
            }
            line += "}"
        }
    }

    /// `text` as a JSON string (RFC 8259: quote, backslash and control characters escaped).
    static func appendJSON(string text: String, to line: inout String) {
        line += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": line += "\\\""
            case "\\": line += "\\\\"
            case "\n": line += "\\n"
            case "\r": line += "\\r"
            case "\t": line += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                line += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: line.unicodeScalars.append(scalar)
            }
        }
        line += "\""
    }

    /// Now in UTC with milliseconds (`2026-11-22T14:01:21.123Z`), as log services parse it.
    private static func utcTimestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S", &parts)
        let milliseconds = Int(now.tv_nsec / 1_000_000)
        let fraction = milliseconds < 10 ? "00\(milliseconds)" : milliseconds < 100 ? "0\(milliseconds)" : "\(milliseconds)"
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self) + ".\(fraction)Z"
    }
}

