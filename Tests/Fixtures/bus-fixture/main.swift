import Bus
import Foundation
import Messages
import ServiceKit

// A bus service process for the system tests: the real service runner (configuration, logging,
// health, SIGTERM handling) with its test methods, `fixture.echo`, `fixture.sleep` and
// `fixture.replica`.
// It runs as the `jobs` service, so `JOBS_BIND` says where it listens.

await ProcessExit.run("bus-fixture", files: Environment.loadFiles()) {
    try await BusServiceRunner.run(.jobs) { router, _, _ in
    router.register(FixtureMethods.echo) { text, _ in text }
    router.register(FixtureMethods.sleep) { milliseconds, context in
        context.logger.info("sleeping", metadata: ["ms": "\(milliseconds)"])
        try await Task.sleep(for: .milliseconds(milliseconds))
        return milliseconds
    }
    router.register(FixtureMethods.replica) { milliseconds, context in
        context.logger.info("replica call", metadata: ["ms": "\(milliseconds)"])
        if milliseconds < 0 {
            // -PID: the replica of that pid holds the call until it dies (or stops); another
            // answers at once. A test kills a replica with calls held there, whatever the load.
            if milliseconds == -Int(getpid()) {
                context.logger.info("holding a replica call")
                try await Task.sleep(for: .seconds(3600))
            }
        } else {
            try await Task.sleep(for: .milliseconds(milliseconds))
        }
        return getpid()
    }
    return []
    }
}
