import Foundation
import PhotoEditKit
import Testing
import ZeroMQ

/// What the processes are given to keep (the JWT secret, the admin token, the URL signing secret,
/// each one's CURVE secret key) never appears in what they log, at `debug`, the most they log.
@Suite("Secrets in logs", .serialized, .timeLimit(.minutes(5)))
struct SecretLogTests {
    @Test func noProcessLogsASecretAtDebugThroughAnEditAndRefusedCallers() async throws {
        // Given the stack on CURVE keys, every process at debug (the tests' level), with a
        // gateway process among them
        let system = try await JobSystem(workers: 1, curve: true)
        let (gateway, port) = try await ClientLibraryTests.gateway(system, extra: system.curve(.gateway).merging(["LOG_LEVEL": "debug"]) { _, new in new })
        // When an edit runs to its end, and callers are refused: a wrong admin token, a forged
        // bearer token, an admin call that is allowed
        let app = ClientLibraryTests.client(port)
        let key = try await app.upload(try Data(contentsOf: JobSystem.fixture))
        let ticket = try await app.createJob(imageKey: key, effect: "copy")
        try await waitUntil { try await app.status(of: ticket.jobId).isFinished }
        #expect(try await app.status(of: ticket.jobId).status == "completed")
        let usage = "/admin/v1/users/device:\(UUID().uuidString.lowercased())/usage"
        #expect(await MetricsTests.get(usage, port: port, headers: "Authorization: Bearer wrong-token\r\n").hasPrefix("HTTP/1.1 403"))
        #expect(await MetricsTests.get(usage, port: port, headers: "Authorization: Bearer \(JobSystem.adminToken)\r\n").hasPrefix("HTTP/1.1 200"))
        let forged = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
        #expect(await MetricsTests.get("/api/v1/users/me", port: port, headers: "Authorization: Bearer \(forged)\r\n").hasPrefix("HTTP/1.1 401"))
        await gateway.stop()
        await system.stop()
        // Then no process's log holds any of them (the logs do hold the lines that once did: a
        // service group's "Starting service", which named each service by its whole value)
        let logs = system.processLogs + [("gateway", gateway.output)]
        #expect(Set(system.secrets).count == 3 + 5 + 1, "the JWT, admin and signing secrets, each role's key, the services' server key")
        #expect(logs.filter { $0.log.contains("Starting service") }.count == logs.count)
        // (A key also as Swift prints its bytes: "[179, 244, 22, ...]", as the worker's line did.)
        let secrets = system.secrets + system.secrets.compactMap { ZMQCurveKeyPair.decode(z85: $0).map { "\($0.prefix(8))".dropLast().description } }
        for (process, log) in logs {
            for secret in secrets {
                let leaked = log.contains(secret)  // (not the log itself in the expectation: it would print the secret)
                #expect(!leaked, "\(process) logged a secret (\(secret.prefix(4))...)")
            }
        }
    }
}
