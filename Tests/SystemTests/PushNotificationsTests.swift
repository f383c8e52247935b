import AsyncHTTPClient
import Crypto
import CryptoExtras
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import NIOSSL
import Testing

/// Push notifications when a job ends, through the real services to `push-fixture`, a local
/// server that speaks APNs' provider API (HTTP/2, ES256 provider tokens) and FCM's HTTP v1 API
/// with its OAuth 2.0 token endpoint, each as documented (the fixture's header names the pages),
/// and that records anything the real service would refuse (`rejected`, required empty).
@Suite("Push notifications", .serialized, .timeLimit(.minutes(5)))
struct PushNotificationsTests {
    static let topic = "com.example.photoedit"

    /// The fixture, the keys it checks, and the variables that point jobs at it.
    final class PushServer: @unchecked Sendable {
        // @unchecked: driven by one test at a time.
        let port = freePort()
        let folder: URL
        let fixture: ServiceProcess
        let apnsKeyPEM: String
        let fcmKeyPEM: String
        let client: HTTPClient
        var caFile: String { folder.appendingPathComponent("ca.pem").path }
        var base: String { "https://127.0.0.1:\(port)" }

        init() async throws {
            folder = FileManager.default.temporaryDirectory.appendingPathComponent("push-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            // The team's APNs key, as a .p8 file (PKCS#8 PEM), and a service account's JSON key.
            apnsKeyPEM = P256.Signing.PrivateKey().pemRepresentation
            try Data(apnsKeyPEM.utf8).write(to: folder.appendingPathComponent("AuthKey.p8"))
            fcmKeyPEM = try _RSA.Signing.PrivateKey(keySize: .bits2048).pkcs8PEMRepresentation
            let account: [String: String] = [
                "type": "service_account", "project_id": "photoedit-test", "private_key_id": "k1", "private_key": fcmKeyPEM,
                "client_email": "push@photoedit-test.iam.gserviceaccount.com", "token_uri": "https://127.0.0.1:\(port)/token",
            ]
            try JSONSerialization.data(withJSONObject: account).write(to: folder.appendingPathComponent("service-account.json"))
            fixture = try ServiceProcess("push-fixture", environment: [
                "FIXTURE_PORT": "\(port)", "FIXTURE_CA_FILE": folder.appendingPathComponent("ca.pem").path,
                "FIXTURE_APNS_KEY_FILE": folder.appendingPathComponent("AuthKey.p8").path, "FIXTURE_APNS_KEY_ID": "KEY0000001",
                "FIXTURE_APNS_TEAM_ID": "TEAM000001", "FIXTURE_APNS_TOPIC": PushNotificationsTests.topic,
                "FIXTURE_FCM_ACCOUNT_FILE": folder.appendingPathComponent("service-account.json").path,
            ])
            // Its stats are read without checking its certificate (jobs checks it: PUSH_CA_FILE).
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateVerification = .none
            client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: .init(tlsConfiguration: tls))
            try await waitUntil(within: .seconds(30)) { (try? await self.stats()) != nil }
        }

        /// What jobs needs to send there.
        var jobsEnvironment: [String: String] {
            [
                "APNS_KEY_ID": "KEY0000001", "APNS_TEAM_ID": "TEAM000001", "APNS_TOPIC": PushNotificationsTests.topic,
                "APNS_KEY_FILE": folder.appendingPathComponent("AuthKey.p8").path, "APNS_URL": base, "APNS_SANDBOX_URL": base,
                "FCM_SERVICE_ACCOUNT_FILE": folder.appendingPathComponent("service-account.json").path, "FCM_URL": base,
                "PUSH_CA_FILE": caFile,
            ]
        }

        func stats() async throws -> [String: Any] {
            let response = try await client.execute(HTTPClientRequest(url: base + "/_fixture/stats"), timeout: .seconds(5))
            let body = try await response.body.collect(upTo: 1 << 20)
            guard response.status == .ok, let object = try JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any] else {
                throw CancellationError()
            }
            return object
        }

        /// The notifications taken, as (token, job id, status) triples.
        func deliveries() async throws -> [(token: String, jobId: String, status: String)] {
            ((try await stats())["deliveries"] as? [[String: Any]] ?? []).map {
                ($0["token"] as? String ?? "", $0["jobId"] as? String ?? "", $0["status"] as? String ?? "")
            }
        }

        func stop() async {
            await fixture.stop()
            try? await client.shutdown()
            try? FileManager.default.removeItem(at: folder)
        }
    }

    static func put(_ client: any TestClientProtocol, _ user: HTTPFields, _ token: String, _ body: String) async throws -> TestResponse {
        var headers = user
        headers[.contentType] = "application/json"
        return try await client.execute(uri: "/api/v1/devices/\(token)", method: .put, headers: headers, body: ByteBuffer(string: body))
    }

    static func delete(_ client: any TestClientProtocol, _ user: HTTPFields, _ token: String) async throws -> HTTPResponse.Status {
        try await client.execute(uri: "/api/v1/devices/\(token)", method: .delete, headers: user).status
    }

    @Test func eachDeviceHearsOfEachJobEndOnceRetriedOn429And5xxAndGoneTokensAreForgotten() async throws {
        let push = try await PushServer()
        let system = try await JobSystem(workers: 1, jobs: push.jobsEnvironment)
        let alice = JobSystem.guest(UUID()), bob = JobSystem.guest(UUID())
        let live = ["a1b2c3d4e5f60718", "fcm-ok:APA91bH", "busyA1", "flakyF1"]
        try await system.gateway { client in
            // Alice's devices: APNs and FCM tokens, one from a development build (APNs sandbox)
            for (token, body) in [("a1b2c3d4e5f60718", #"{"platform": "apns"}"#), ("fcm-ok:APA91bH", #"{"platform": "android"}"#),
                                  ("goneA1", #"{"platform": "ios"}"#), ("goneF1", #"{"platform": "fcm"}"#),
                                  ("busyA1", #"{"platform": "apns"}"#), ("flakyF1", #"{"platform": "fcm"}"#),
                                  ("sandboxA1", #"{"platform": "apns", "environment": "sandbox"}"#)] {
                let answer = try await Self.put(client, alice, token, body)
                #expect(answer.status == .ok, "\(token): \(String(buffer: answer.body))")
                #expect(JobSystem.json(answer)["token"] as? String == token)
            }
            #expect(JobSystem.json(try await Self.put(client, alice, "sandboxA1", #"{"platform": "apns", "environment": "sandbox"}"#))["environment"] as? String == "sandbox")
            #expect(try await Self.put(client, bob, "b0b0b0b0", #"{"platform": "apns"}"#).status == .ok)
            // Bad input: a clear 400, nothing registered; no identity: 401
            #expect(try await Self.put(client, alice, "blackberry1", #"{"platform": "blackberry"}"#).status == .badRequest)
            #expect(try await Self.put(client, alice, "sand1", #"{"platform": "apns", "environment": "staging"}"#).status == .badRequest)
            #expect(try await Self.put(client, alice, "bad$token", #"{"platform": "apns"}"#).status == .badRequest)
            #expect(try await Self.put(client, alice, String(repeating: "a", count: 600), #"{"platform": "apns"}"#).status == .badRequest)
            #expect(try await Self.put(client, alice, "x1", #"{"platform": 7}"#).status == .badRequest)
            #expect(try await Self.put(client, alice, "x1", "{not json").status == .badRequest)
            #expect(try await Self.put(client, [:], "x1", #"{"platform": "apns"}"#).status == .unauthorized)
            // Someone else's token: 404, and it stays theirs
            #expect(try await Self.delete(client, bob, "a1b2c3d4e5f60718") == .notFound)
            #expect(try await Self.delete(client, alice, "never-registered") == .notFound)

            // A job that completes: each of Alice's devices hears of it once
            let key = try await JobSystem.upload(client, as: alice)
            let done = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "copy"))
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: done)["status"] as? String == "completed")
            try await waitUntil {
                let taken = try await push.deliveries()
                return Set(taken.filter { $0.jobId == done && $0.status == "completed" }.map(\.token)) == Set(live + ["sandboxA1"])
            }
            try await Self.waitForEmptyOutbox(system)
            var taken = try await push.deliveries()
            for token in live + ["sandboxA1"] {
                #expect(taken.filter { $0.token == token && $0.jobId == done }.count == 1, "\(token) heard of the job more than once")
            }
            #expect(!taken.contains { $0.token == "b0b0b0b0" }, "Bob heard of Alice's job")
            let stats = try await push.stats()
            let refusals = stats["refusals"] as? [String: Int] ?? [:]
            #expect(refusals["busyA1"] == 1 && refusals["flakyF1"] == 1, "429 and 5xx tried again: \(refusals)")
            #expect(refusals["goneA1"] == 1 && refusals["goneF1"] == 1, "\(refusals)")
            // Tokens APNs (410 Unregistered) and FCM (UNREGISTERED) no longer know are forgotten
            #expect(try await Self.delete(client, alice, "goneA1") == .notFound)
            #expect(try await Self.delete(client, alice, "goneF1") == .notFound)
            #expect(try await Self.delete(client, alice, "sandboxA1") == .noContent)

            // A job that fails: the devices left hear of it, once each
            let broken = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "broken-remote"))
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: broken)["status"] as? String == "failed")
            try await waitUntil {
                Set(try await push.deliveries().filter { $0.jobId == broken && $0.status == "failed" }.map(\.token)) == Set(live)
            }
            try await Self.waitForEmptyOutbox(system)
            taken = try await push.deliveries()
            for token in live { #expect(taken.filter { $0.token == token && $0.jobId == broken }.count == 1) }
            #expect(!taken.contains { ["goneA1", "goneF1", "sandboxA1"].contains($0.token) && $0.jobId == broken })
            let rejected = (try await push.stats())["rejected"] as? [String]
            #expect(rejected?.isEmpty == true, "\(rejected ?? [])")
        }
        // The keys are in no process's log
        let logs = system.processLogs.map(\.log).joined(separator: "\n")
        for pem in [push.apnsKeyPEM, push.fcmKeyPEM] {
            let body = pem.split(separator: "\n").dropFirst().prefix(1).joined()
            #expect(!body.isEmpty && !logs.contains(body))
        }
        await system.stop()
        await push.stop()
    }

    /// Until jobs' push outbox is empty (nothing left to send or to try again).
    static func waitForEmptyOutbox(_ system: JobSystem) async throws {
        try await waitUntil(within: .seconds(60)) {
            let metrics = try await MetricsTests.scrape(port: system.gatewayPort).exposition
            return metrics.value("jobs_outbox_backlog", ["service": "jobs", "topic": "push"]) == 0
        }
    }
}
