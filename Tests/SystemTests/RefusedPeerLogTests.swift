import Foundation
import Testing
import ZeroMQ

/// A worker that cannot be admitted (no key, another deployment's server key, a key jobs does not
/// list) is logged, once and saying why, on both sides; it never says `connected`.
@Suite("Refused workers in the logs", .serialized, .timeLimit(.minutes(5)))
struct RefusedPeerLogTests {
    @Test func aWorkerWithNoKeyTheWrongServerKeyOrAnUnlistedKeyIsLoggedOnBothSidesAndAGoodOneConnects() async throws {
        // Given jobs on CURVE with its callers listed
        let system = try await JobSystem(workers: 0, curve: true)
        let jobs = try #require(system.services.processes[.jobs])
        let otherServer = try ZMQCurveKeyPair.generate(), stranger = try ZMQCurveKeyPair.generate()
        // When workers come with no key, with another server's public key, and with a key not listed
        let plain = try system.startWorker(extra: ["BUS_CURVE_PUBLIC": "", "BUS_CURVE_KEY": ""])
        let wrongServer = try system.startWorker(extra: ["BUS_CURVE_PUBLIC": otherServer.publicKey])
        let unlisted = try system.startWorker(extra: ["BUS_CURVE_KEY": stranger.secretKey])
        // Then each says why, once, and jobs says why for the first two (the allow-list refusal
        // is its ZAP handler's line)
        let answers = [
            (plain, "does not speak CURVE as this process does"),
            (wrongServer, "closed the connection during the handshake"),
            (unlisted, "refused this process's key"),
        ]
        for (worker, reason) in answers {
            try await waitUntil(within: .seconds(30)) { worker.output.contains(reason) && worker.output.contains("the jobs service does not answer") }
        }
        try await waitUntil(within: .seconds(30)) {
            jobs.output.contains("a peer connected without CURVE") && jobs.output.contains("its BUS_CURVE_PUBLIC is not this service's public key")
        }
        // Across several attempts: one line each, and never "connected"
        try await waitUntil(within: .seconds(30)) { wrongServer.output.components(separatedBy: "trying again").count > 3 }
        for (worker, reason) in answers {
            let output = worker.output
            #expect(output.components(separatedBy: reason).count == 2, "\(reason): \(output.components(separatedBy: reason).count - 1) lines")
            #expect(output.components(separatedBy: "the jobs service does not answer; trying again").count == 2)
            #expect(!output.split(separator: "\n").contains { $0.hasSuffix("] connected") }, "a refused worker said connected")
        }
        #expect(jobs.output.components(separatedBy: "a peer connected without CURVE").count == 2)
        // And a worker with the right keys says connected, and is ready at jobs
        let good = try system.startWorker()
        try await waitUntil(within: .seconds(30)) { good.output.split(separator: "\n").contains { $0.hasSuffix("] connected") } }
        #expect(!good.output.contains("does not answer"))
        await system.stop()
    }
}
