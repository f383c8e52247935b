import Logging
import Synchronization

/// Logs a failure that repeats (a full disk, a service that is down) once, not once per request
/// or retry: the first occurrence of each kind at `error`, then at most one line a `quiet`
/// period saying how many more there were, and one `info` line when `recovered` is called after
/// failures.
public final class FailureLog: Sendable {
    private struct Kind {
        var lastLogged: ContinuousClock.Instant
        var suppressed: Int
    }

    private let logger: Logger
    private let quiet: Duration
    private let kinds = Mutex<[String: Kind]>([:])

    public init(logger: Logger, quiet: Duration = .seconds(60)) {
        self.logger = logger
        self.quiet = quiet
    }

    /// Records one failure of `kind`; logs it if it is the first of its kind or the quiet
    /// period has passed since the kind was last logged.
    public func record(_ kind: String, _ message: @autoclosure () -> String, now: ContinuousClock.Instant = .now) {
        let (log, suppressed): (Bool, Int) = kinds.withLock { kinds in
            guard var known = kinds[kind] else {
                kinds[kind] = Kind(lastLogged: now, suppressed: 0)
                return (true, 0)
            }
            guard known.lastLogged.duration(to: now) >= quiet else {
                known.suppressed += 1
                kinds[kind] = known
                return (false, 0)
            }
            let count = known.suppressed
            kinds[kind] = Kind(lastLogged: now, suppressed: 0)
            return (true, count)
        }
        guard log else { return }
        var metadata: Logger.Metadata = ["kind": "\(kind)"]
        if suppressed > 0 { metadata["repeated"] = "\(suppressed)" }
        logger.error("\(message())", metadata: metadata)
    }

    /// The failures of `kind` are over (a write went through): says so once, if any were logged.
    public func recovered(_ kind: String) {
        let had = kinds.withLock { kinds in kinds.removeValue(forKey: kind) }
        if let had {
            logger.info("recovered", metadata: ["kind": "\(kind)", "repeated": "\(had.suppressed)"])
        }
    }
}
