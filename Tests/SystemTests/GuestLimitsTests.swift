import AppAttest
import Bus
import Foundation
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import Testing

/// Guests cannot mint free edits by rotating device ids (real quota and jobs processes): a client
/// network makes a bounded number of new guests an hour, and its guests share the day's free
/// credits. The requests come through a trusted proxy (`TRUSTED_PROXIES`), which says in
/// `X-Forwarded-For` where each came from.
@Suite("Guest limits", .serialized, .timeLimit(.minutes(5)))
struct GuestLimitsTests {
    static func guest(_ device: UUID, from address: String) -> HTTPFields {
        [.init("X-Device-Id")!: device.uuidString, .init("X-Forwarded-For")!: "198.51.100.9, \(address)"]
    }

    @Test func theClientNetworkIsThePeersOrTheForwardedOneBehindATrustedProxy() throws {
        let direct = try ClientNetworks(trustedProxies: nil)
        #expect(direct.network(peer: try SocketAddress(ipAddress: "203.0.113.77", port: 5000), forwardedFor: "10.0.0.1") == "v4:203.0.113.0/24")
        #expect(direct.network(peer: try SocketAddress(ipAddress: "127.0.0.1", port: 5000), forwardedFor: "203.0.113.1") == nil, "loopback: not limited")
        #expect(direct.network(peer: try SocketAddress(ipAddress: "2001:db8:1234:5678::1", port: 5000), forwardedFor: nil) == "v6:2001:db8:1234:5600::/56")
        let proxied = try ClientNetworks(trustedProxies: "127.0.0.1/32, 10.0.0.0/8")
        // The right-most address that is not a trusted proxy; what the client wrote left of it is ignored
        #expect(proxied.network(peer: try SocketAddress(ipAddress: "127.0.0.1", port: 1), forwardedFor: "1.2.3.4, 203.0.113.5, 10.1.1.1") == "v4:203.0.113.0/24")
        #expect(proxied.network(peer: try SocketAddress(ipAddress: "192.0.2.1", port: 1), forwardedFor: "203.0.113.5") == "v4:192.0.2.0/24", "an untrusted peer's header is not believed")
        #expect(throws: (any Error).self) { try ClientNetworks(trustedProxies: "not-an-address") }
    }

    @Test func aNetworkMakesAtMostThirtyNewGuestsAnHourAndItsGuestsShareTheDaysCredits() async throws {
        let system = try await JobSystem(workers: 1, quota: ["QUOTA_GUESTS_PER_NETWORK_HOUR": "30", "QUOTA_GUEST_NETWORK_DAILY": "5"])
        system.configuration.clientNetworks = try ClientNetworks(trustedProxies: "127.0.0.1/32")
        try await system.gateway { client in
            // 50 new device ids from one network: 30 admitted, then 429 naming the limit
            var statuses: [HTTPResponse.Status] = []
            var devices: [UUID] = []
            var refusal: [String: Any] = [:]
            for _ in 0..<50 {
                let device = UUID()
                devices.append(device)
                let response = try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(device, from: "203.0.113.\(Int.random(in: 1...254))"))
                statuses.append(response.status)
                if response.status == .tooManyRequests { refusal = JobSystem.json(response) }
            }
            #expect(statuses.prefix(30).allSatisfy { $0 == .ok } && statuses.suffix(20).allSatisfy { $0 == .tooManyRequests }, "\(statuses)")
            #expect(refusal["code"] as? String == "guest_limit" && refusal["limit"] as? Int == 30, "\(refusal)")
            // A guest admitted before is still served; another network is not affected
            let known = try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(devices[0], from: "203.0.113.200"))
            #expect(known.status == .ok)
            let elsewhere = try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(UUID(), from: "192.0.2.10"))
            #expect(elsewhere.status == .ok)

            // Two guests of one network share its 5 credits of the day (each has 20 of its own)
            let first = Self.guest(devices[1], from: "203.0.113.1"), second = Self.guest(devices[2], from: "203.0.113.2")
            let firstKey = try await JobSystem.upload(client, as: first)
            let secondKey = try await JobSystem.upload(client, as: second)
            for _ in 0..<3 { #expect(try await JobSystem.createJob(client, as: first, imageKey: firstKey, effect: "grayscale").status == .accepted) }
            for _ in 0..<2 { #expect(try await JobSystem.createJob(client, as: second, imageKey: secondKey, effect: "grayscale").status == .accepted) }
            let refused = try await JobSystem.createJob(client, as: second, imageKey: secondKey, effect: "grayscale")
            #expect(refused.status == .tooManyRequests)
            let problem = JobSystem.json(refused)
            #expect((problem["violated-policies"] as? [String]) == ["network"] && problem["creditsRemaining"] as? Int == 0, "\(problem)")
            // A guest of another network still has its own
            let other = Self.guest(UUID(), from: "192.0.2.11")
            let otherKey = try await JobSystem.upload(client, as: other)
            #expect(try await JobSystem.createJob(client, as: other, imageKey: otherKey, effect: "grayscale").status == .accepted)
        }
        await system.stop()
    }

    /// The real attestation sample of `AppAttestVerifierTests` (an iPhone's, from
    /// github.com/veehaitch/devicecheck-appattest): its key id and object.
    static let sample: (keyId: String, attestation: String) = {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("AppAttestTests/Fixtures/iOS14-attestation-sample.json")
        let json = (try? JSONSerialization.jsonObject(with: Data(contentsOf: file))) as? [String: Any] ?? [:]
        return (json["keyIdBase64"] as? String ?? "", json["attestationBase64"] as? String ?? "")
    }()

    @Test func attestedGuestsPassTheNetworkLimitsAndTheAttestationRoutesCheckWhatTheyAreSent() async throws {
        let system = try await JobSystem(workers: 1, quota: ["QUOTA_GUESTS_PER_NETWORK_HOUR": "2", "QUOTA_GUEST_NETWORK_DAILY": "1"])
        system.configuration.clientNetworks = try ClientNetworks(trustedProxies: "127.0.0.1/32")
        system.configuration.appAttest = AppAttestSettings(appId: "6MURL8TA57.de.vincent-haupert.apple-appattest-poc", environment: .development)
        try await withBusClient(.init(endpoint: system.services.endpoints[.quota]!)) { quota in
            let attested = UUID(), stranger = UUID()
            try await system.gateway { client in
                // The network's two new guests of the hour, then the limit
                for _ in 0..<2 {
                    #expect(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(UUID(), from: "203.0.113.7")).status == .ok)
                }
                #expect(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(attested, from: "203.0.113.8")).status == .tooManyRequests)

                // The attestation routes pass the limit: a challenge for this device
                let asked = try await client.execute(uri: "/api/v1/guests/attestation/challenge", method: .post, headers: Self.guest(attested, from: "203.0.113.8"))
                #expect(asked.status == .ok)
                let challenge = try #require(JobSystem.json(asked)["challenge"] as? String)
                #expect(JobSystem.json(asked)["expiresAt"] is String)
                let otherChallenge = try #require(JobSystem.json(try await client.execute(
                    uri: "/api/v1/guests/attestation/challenge", method: .post, headers: Self.guest(stranger, from: "203.0.113.9")))["challenge"] as? String)

                func attest(_ device: UUID, keyId: String, attestation: String, challenge: String) async throws -> TestResponse {
                    let body = try JSONSerialization.data(withJSONObject: ["keyId": keyId, "attestation": attestation, "challenge": challenge])
                    return try await client.execute(uri: "/api/v1/guests/attestation", method: .post, headers: Self.guest(device, from: "203.0.113.8"), body: ByteBuffer(bytes: body))
                }
                // A real attestation, but not made for this challenge (and its certificate long expired): refused
                let refused = try await attest(attested, keyId: Self.sample.keyId, attestation: Self.sample.attestation, challenge: challenge)
                #expect(refused.status == .unprocessableContent && JobSystem.json(refused)["code"] as? String == "attestation_refused", "\(JobSystem.json(refused))")
                // Another device's challenge, a made-up challenge, a key id that is not 32 bytes, garbage
                #expect(JobSystem.json(try await attest(attested, keyId: Self.sample.keyId, attestation: Self.sample.attestation, challenge: otherChallenge))["code"] as? String == "invalid_challenge")
                #expect(try await attest(attested, keyId: Self.sample.keyId, attestation: Self.sample.attestation, challenge: "AAAA").status == .badRequest)
                #expect(try await attest(attested, keyId: "c2hvcnQ=", attestation: Self.sample.attestation, challenge: challenge).status == .badRequest)
                #expect(try await attest(attested, keyId: Self.sample.keyId, attestation: "b25seSBnYXJiYWdl", challenge: challenge).status == .unprocessableContent)
                // Nothing was bound: the device is still refused on its network
                #expect(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(attested, from: "203.0.113.8")).status == .tooManyRequests)

                // Bound in quota as the route binds a verified key: the guest passes its network's
                // limit of new guests, and does not share its network's credits of the day
                let userId = "device:\(attested.uuidString.lowercased())"
                #expect(try await quota.call(Quota.attestGuest, AttestGuest(userId: userId, network: "v4:203.0.113.0/24", keyId: Self.sample.keyId)).attested)
                #expect(try await quota.call(Quota.attestGuest, AttestGuest(userId: "device:\(stranger.uuidString.lowercased())", network: "v4:203.0.113.0/24", keyId: Self.sample.keyId)).attested == false,
                        "a key belongs to one guest")
                let headers = Self.guest(attested, from: "203.0.113.8")
                #expect(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: headers).status == .ok)
                let key = try await JobSystem.upload(client, as: headers)
                for _ in 0..<3 { #expect(try await JobSystem.createJob(client, as: headers, imageKey: key, effect: "grayscale").status == .accepted) }
            }

            // With attestation required, an unattested guest is refused (403 naming it) and the
            // attested one served
            system.configuration.appAttest?.required = true
            try await system.gateway { client in
                let refused = try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(UUID(), from: "192.0.2.44"))
                #expect(refused.status == .forbidden && JobSystem.json(refused)["code"] as? String == "attestation_required", "\(JobSystem.json(refused))")
                #expect(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: Self.guest(attested, from: "192.0.2.44")).status == .ok)
                #expect(try await client.execute(uri: "/api/v1/guests/attestation/challenge", method: .post, headers: Self.guest(UUID(), from: "192.0.2.44")).status == .ok)
            }
            // Without App Attest configured, the routes are not there
            system.configuration.appAttest = nil
            try await system.gateway { client in
                let absent = try await client.execute(uri: "/api/v1/guests/attestation/challenge", method: .post, headers: Self.guest(UUID(), from: "192.0.2.45"))
                #expect(absent.status == .notFound)
            }
        }
        await system.stop()
    }
}
