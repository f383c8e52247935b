import Logging
import ServiceLifecycle

/// The loop of a service's background work: `round` now and then every `interval` until graceful
/// shutdown (which cancels the wait, so the process exits at once). A round that throws is logged
/// with `failure` and the next one comes as usual.
public enum Periodic {
    public static func run(
        every interval: Duration, logger: Logger, failure: Logger.Message, _ round: @escaping @Sendable () async throws -> Void
    ) async {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    try await round()
                } catch {
                    logger.error(failure, metadata: ["error": "\(error)"])
                }
                try await Task.sleep(for: interval)
            }
        }
    }
}
