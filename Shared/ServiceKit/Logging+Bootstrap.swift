import Logging

/// Process-wide logging: one line per event on standard output, labelled with the process's name,
/// metadata as `key=value` (request ids among them).
public enum ProcessLogging {
    /// Installs the log handler; call once, first thing in `main`.
    public static func bootstrap(level: Logger.Level) {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardOutput(label: label)
            handler.logLevel = level
            return handler
        }
    }
}
