import Logging
import ServiceLifecycle

/// The loop of a service's background work: `round` now and then every `interval` until graceful
/// shutdown (which cancels the wait, so the process exits at once). A round that throws is
/// logged with `failure` once, not every round while the cause lasts (a full disk, a service
/// that is down), and the round that succeeds again says so; the next round comes as usual.
public enum Periodic {
    public static func run(
        every interval: Duration, logger: Logger, failure: Logger.Message, _ round: @escaping @Sendable () async throws -> Void
    ) async {
        try? await cancelWhenGracefulShutdown {
            var failedRounds = 0
            while !Task.isCancelled {
                do {
                    try await round()
                    if failedRounds > 0 {
                        logger.info("\(failure): recovered", metadata: ["failed-rounds": "\(failedRounds)"])
                        failedRounds = 0
                    }
                } catch where Task.isCancelled {
                    // Shutting down: a round cut short is not a failure.
                    return
                } catch {
                    if failedRounds == 0 { logger.error(failure, metadata: ["error": "\(error)"]) }
                    failedRounds += 1
                }
                try await Task.sleep(for: interval)
            }
        }
    }
}
