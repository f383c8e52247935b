import Foundation
@testable import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

/// The console's files as the gateway serves them. What it does in a browser is checked by
/// scripts/console-check.sh (Chromium driven by Selenium against a live stack).
@Suite("The operators' console", .serialized, .timeLimit(.minutes(5)))
struct ConsoleTests {
    static let folder = ContractTests.file.deletingLastPathComponent().appendingPathComponent("Services/gateway/Console")

    @Test func theEmbeddedFilesAreTheConsolesFiles() throws {
        for (file, embedded) in [("index.html", ConsoleAssets.indexHTML), ("console.css", ConsoleAssets.css), ("console.js", ConsoleAssets.javascript)] {
            var text = try String(contentsOf: Self.folder.appendingPathComponent(file), encoding: .utf8)
            if text.hasSuffix("\n") { text.removeLast() }
            #expect(embedded == text, "\(file) changed: run make generate (scripts/embed-console.sh)")
        }
    }

    @Test func thePageIsServedWithAStrictPolicyAndHoldsNoSecret() async throws {
        let system = try await JobSystem(workers: 0, gateway: ["VIEWER_TOKEN": "viewer-token-for-the-console-test"])
        try await system.gateway { client in
            var source = ""
            for (path, type) in [("/admin", "text/html"), ("/admin/console.js", "text/javascript"), ("/admin/console.css", "text/css")] {
                let response = try await client.execute(uri: path, method: .get)
                #expect(response.status == .ok && response.headers[.contentType]?.hasPrefix(type) == true, "\(path)")
                #expect(response.headers[.contentSecurityPolicy]?.contains("script-src 'self'") == true && response.headers[.xContentTypeOptions] == "nosniff")
                source += String(buffer: response.body)
            }
            #expect(source.contains("/admin/v1/overview"))
            // No token, secret or signed link in the page source
            for secret in [JobSystem.adminToken, "viewer-token-for-the-console-test", JobSystem.secret, JobSystem.signingSecret, "sig=", "X-Amz-Signature"] {
                #expect(!source.contains(secret), "the console's source holds \(secret)")
            }
            // The session says which token it is; anything else is refused
            let admin = try await client.execute(uri: "/admin/v1/session", method: .get, headers: [.authorization: "Bearer \(JobSystem.adminToken)"])
            #expect(JobSystem.json(admin)["role"] as? String == "admin")
            let viewer = try await client.execute(uri: "/admin/v1/session", method: .get, headers: [.authorization: "Bearer viewer-token-for-the-console-test"])
            #expect(JobSystem.json(viewer)["role"] as? String == "viewer")
            #expect(try await client.execute(uri: "/admin/v1/session", method: .get, headers: [.authorization: "Bearer guess"]).status == .forbidden)
            #expect(try await client.execute(uri: "/admin/v1/session", method: .get).status == .unauthorized)

            // A job's files come through the gateway under an operator's token only
            let alice = JobSystem.guest(UUID())
            let key = try await JobSystem.upload(client, as: alice)
            let jobId = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "copy"))
            let input = try await client.execute(uri: "/admin/v1/jobs/\(jobId)/files/input", method: .get, headers: [.authorization: "Bearer viewer-token-for-the-console-test"])
            #expect(input.status == .ok && input.headers[.contentType] == "image/jpeg" && input.body.readableBytes > 100)
            #expect(try await client.execute(uri: "/admin/v1/jobs/\(jobId)/files/result", method: .get, headers: [.authorization: "Bearer \(JobSystem.adminToken)"]).status == .notFound)
            #expect(try await client.execute(uri: "/admin/v1/jobs/\(jobId)/files/secrets", method: .get, headers: [.authorization: "Bearer \(JobSystem.adminToken)"]).status == .notFound)
            #expect(try await client.execute(uri: "/admin/v1/jobs/\(jobId)/files/input", method: .get, headers: alice).status == .unauthorized)
        }
        await system.stop()
    }
}
