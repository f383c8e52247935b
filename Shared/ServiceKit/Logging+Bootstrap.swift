#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Logging
import Synchronization

/// Process-wide logging: one line per event on standard output, labelled with the process's name,
/// metadata as `key=value` (request ids among them).
public enum ProcessLogging {
    /// Installs the log handler; call once, first thing in `main`. Each line's label names the
    /// process (`quota`, `worker-2`), and the logger within it when that is another
    /// (`gateway/Hummingbird`), so lines of several processes on one terminal tell whose they are
    /// without a filter in between.
    public static func bootstrap(level: Logger.Level, process: String? = nil) {
        LoggingSystem.bootstrap { label in
            ProcessLogHandler(label: process.map { $0 == label ? label : "\($0)/\(label)" } ?? label, level: level)
        }
    }
}

/// swift-log's `StreamLogHandler` line format (`2026-11-22T14:01:21+0000 info quota: key=value
/// [source] message`), but metadata is formatted only when a line is written. StreamLogHandler
/// formats it again on every change, and every HTTP request sets some (its id): in the gateway's
/// profile that was 5 % of the CPU, for lines that at `warning` are never written.
public struct ProcessLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
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
        let fields = all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let text = "\(Self.timestamp()) \(event.level) \(label):\(fields) [\(event.source)] \(event.message)\n"
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
