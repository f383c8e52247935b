import Bus
import Foundation
import Messages
import ServiceKit

// A bus service process for the system tests: the real service runner (configuration, logging,
// health, SIGTERM handling) with its test methods, `fixture.echo`, `fixture.sleep` and
// `fixture.replica`.
// It runs as the `jobs` service, so `JOBS_BIND` says where it listens.

await ProcessExit.run("bus-fixture") {
    try await BusServiceRunner.run(.jobs) { router, _, _ in
    router.register(FixtureMethods.echo) { text, _ in text }
    router.register(FixtureMethods.sleep) { milliseconds, context in
        context.logger.info("sleeping", metadata: ["ms": "\(milliseconds)"])
        try await Task.sleep(for: .milliseconds(milliseconds))
        return milliseconds
    }
    router.register(FixtureMethods.replica) { milliseconds, context in
        context.logger.info("replica call", metadata: ["ms": "\(milliseconds)"])
        try await Task.sleep(for: .milliseconds(milliseconds))
        return getpid()
    }
    return []
    }
}
