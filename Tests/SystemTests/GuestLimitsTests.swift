import Foundation
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

/// Guests cannot mint free edits by rotating device ids (real quota and jobs processes): a client
/// network makes a bounded number of new guests an hour, and its guests share the day's free
/// credits. The requests come through a trusted proxy (`TRUSTED_PROXIES`), which says in
/// `X-Forwarded-For` where each came from.
@Suite("Guest limits", .serialized)
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
}
