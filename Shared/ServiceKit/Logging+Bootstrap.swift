import Logging

/// Process-wide logging: one line per event on standard output, labelled with the process's name,
/// metadata as `key=value` (request ids among them).
public enum ProcessLogging {
    /// Installs the log handler; call once, first thing in `main`. Each line's label names the
    /// process (`quota`, `worker-2`), and the logger within it when that is another
    /// (`gateway/Hummingbird`), so lines of several processes on one terminal tell whose they are
    /// without a filter in between.
    public static func bootstrap(level: Logger.Level, process: String? = nil) {
        LoggingSystem.bootstrap { label in
            let name = process.map { $0 == label ? label : "\($0)/\(label)" } ?? label
            var handler = StreamLogHandler.standardOutput(label: name)
            handler.logLevel = level
            return handler
        }
    }
}
