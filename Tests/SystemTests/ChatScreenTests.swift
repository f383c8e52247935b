import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

/// The Chat screen (`../shared/seeds/004_5dbdde8e635b1f81.txt`) end to end through the gateway:
/// its own create request, the paywall's webhook, credits, uploads blocked at 0.
///
/// Webhook payloads follow Adapty's documentation: the envelope of "Webhook event types and
/// fields" / "Webhook integration" (`profile_id`, `customer_user_id`, `event_type`,
/// `event_datetime` as `2020-07-10T15:00:00.000000+0000`, `event_properties` with
/// `profile_event_id` and `subscription_expires_at`), and the verification request of "Set up
/// webhook integration" (an empty JSON object; older integrations `{"adapty_check": ...}`).
@Suite("The Chat screen", .serialized, .timeLimit(.minutes(5)))
struct ChatScreenTests {
    static let webhookSecret = "test-adapty-secret"

    static func adaptyTime(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSZ"
        return formatter.string(from: date)
    }

    /// An Adapty event as its documentation shows it.
    static func event(_ type: String, user: String?, id: String = UUID().uuidString, at: Date = Date(), expiresAt: Date? = nil) -> ByteBuffer {
        var properties: [String: Any] = [
            "profile_event_id": id, "store": "app_store", "vendor_product_id": "pro_monthly",
            "transaction_id": "1000000\(Int.random(in: 100_000...999_999))", "environment": "Sandbox",
        ]
        if let expiresAt { properties["subscription_expires_at"] = adaptyTime(expiresAt) }
        var envelope: [String: Any] = [
            "profile_id": "772204ce-ebf6-4ed9-82b0-d8688ab62b01", "event_type": type, "event_datetime": adaptyTime(at),
            "event_properties": properties, "event_api_version": 1,
        ]
        if let user { envelope["customer_user_id"] = user }
        return ByteBuffer(bytes: try! JSONSerialization.data(withJSONObject: envelope))
    }

    static func post(_ client: any TestClientProtocol, _ body: ByteBuffer, authorization: String? = webhookSecret) async throws -> TestResponse {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let authorization { headers[.authorization] = authorization }
        return try await client.execute(uri: "/webhooks/adapty", method: .post, headers: headers, body: body)
    }

    static func me(_ client: any TestClientProtocol, _ user: HTTPFields) async throws -> [String: Any] {
        JobSystem.json(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: user))
    }

    @Test func theChatScreensCreateRequestWorksWordForWordAndItsParametersApply() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // The request exactly as the Chat screen document shows it
            let chat = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: """
                {"imageKey": "\(key)", "model": "default", "parameters": {"fidelity": 0.8, "upscale": 2}}
                """))
            #expect(chat.status == .accepted)
            let chatJob = try JobSystem.jobId(of: chat)
            // And the same with fidelity 0 (the original, only upscaled)
            let plain = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "default", parameters: #"{"fidelity": 0, "upscale": 2}"#)
            let plainJob = try JobSystem.jobId(of: plain)
            var results: [Data] = []
            for jobId in [chatJob, plainJob] {
                let done = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
                #expect(done["status"] as? String == "completed", "\(done)")
                let url = try #require(done["resultUrl"] as? String)
                let file = try await client.execute(uri: JobSystem.path(url), method: .get)
                results.append(Data(buffer: file.body))
            }
            // Then both are twice the original's size, and the enhancement made a difference
            let (width, height) = try JobSystem.dimensions(of: try Data(contentsOf: JobSystem.fixture))
            for result in results {
                let (w, h) = try JobSystem.dimensions(of: result)
                #expect(w == width * 2 && h == height * 2, "result is \(w)x\(h), original \(width)x\(height)")
            }
            #expect(results[0] != results[1])
            // And out-of-range values are refused, naming the parameter
            let bad = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "default", parameters: #"{"fidelity": 1.5}"#)
            #expect(bad.status == .unprocessableContent)
            // And a request that names no effect at all (the document makes both optional) gets
            // the default, as "model": "default" does
            let unnamed = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: #"{"imageKey": "\#(key)"}"#))
            #expect(unnamed.status == .accepted)
            let unnamedId = try JobSystem.jobId(of: unnamed)
            let unnamedJob = JobSystem.json(try await client.execute(uri: "/api/v1/jobs/\(unnamedId)", method: .get, headers: user))
            #expect(unnamedJob["effectId"] as? String == "auto-enhance", "\(unnamedJob)")
        }
        await system.stop()
    }

    @Test func aPaywallPurchaseMakesTheUserProAndItsExpiryFreeAgain() async throws {
        let system = try await JobSystem(workers: 0)
        system.configuration.adaptyWebhookSecret = Self.webhookSecret
        let sub = "chat-\(UUID().uuidString.lowercased())"
        let user = try await JobSystem.signedIn(sub)
        try await system.gateway { client in
            // Given a free user at 20 of 20 today
            let key = try await JobSystem.upload(client, as: user)
            for _ in 0..<20 { #expect(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy").status == .accepted) }
            #expect(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy").status == .tooManyRequests)
            // And the app blocks at 0 on the server too: presign is the quota 429, with its headers
            let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                   body: ByteBuffer(string: #"{"filename": "a.jpg", "contentType": "image/jpeg"}"#))
            #expect(presign.status == .tooManyRequests)
            #expect(presign.headers[.retryAfter] != nil && presign.headers[.init("RateLimit")!] != nil && presign.headers[.init("RateLimit-Policy")!] != nil)
            #expect(JobSystem.json(presign)["violated-policies"] as? [String] == ["daily"])
            // And credits say 0 left
            let credits = try await client.execute(uri: "/api/v1/users/me/credits", method: .get, headers: user)
            let creditsBody = JobSystem.json(credits)
            #expect(creditsBody["dailyRemaining"] as? Int == 0 && creditsBody["dailyLimit"] as? Int == 20 && creditsBody["isPro"] as? Bool == false)
            #expect(creditsBody["monthlyRemaining"] as? Int == 580 && creditsBody["dailyResetsAt"] is String)
            #expect(credits.headers[.init("RateLimit")!]?.contains(#""daily";r=0"#) == true)

            // When Adapty says the subscription started, paid until a month from now
            let periodEnd = Date().addingTimeInterval(30 * 86_400)
            let started = try await Self.post(client, Self.event("subscription_started", user: sub, expiresAt: periodEnd))
            #expect(started.status == .ok)
            #expect(JobSystem.json(started)["result"] as? String == "applied")
            // Then users/me shows PRO until the period's end, and creating works again
            let pro = try await Self.me(client, user)
            #expect(pro["isPro"] as? Bool == true && pro["plan"] as? String == "pro" && pro["planEndsAt"] is String)
            #expect((pro["quota"] as? [String: Any])?["dailyRemaining"] as? Int == 480)
            #expect(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy").status == .accepted)

            // When it expires
            let expired = try await Self.post(client, Self.event("subscription_expired", user: sub, at: Date().addingTimeInterval(1)))
            #expect(JobSystem.json(expired)["result"] as? String == "applied")
            // Then free again, and 429 again: today's 21 are over free's 20 (0 left, not -1)
            let free = try await Self.me(client, user)
            #expect(free["isPro"] as? Bool == false && (free["quota"] as? [String: Any])?["dailyRemaining"] as? Int == 0)
            #expect(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy").status == .tooManyRequests)
        }
        await system.stop()
    }

    @Test func theWebhookIsAuthenticatedVerifiedAndIgnoresWhatItDoesNotActOn() async throws {
        let system = try await JobSystem(workers: 0)
        let sub = "hook-\(UUID().uuidString.lowercased())"
        let user = try await JobSystem.signedIn(sub)
        // With no secret configured the route does not exist
        try await system.gateway { client in
            let answer = try await Self.post(client, Self.event("subscription_started", user: sub))
            #expect(answer.status == .notFound)
        }
        system.configuration.adaptyWebhookSecret = Self.webhookSecret
        try await system.gateway { client in
            // Wrong or missing Authorization: 401, nothing applied
            #expect(try await Self.post(client, Self.event("subscription_started", user: sub), authorization: "wrong").status == .unauthorized)
            #expect(try await Self.post(client, Self.event("subscription_started", user: sub), authorization: nil).status == .unauthorized)
            #expect(try await Self.post(client, Self.event("subscription_started", user: sub), authorization: "Bearer \(Self.webhookSecret)").status == .unauthorized)
            // The verification request: an empty object, answered 200 with a JSON body
            let verify = try await Self.post(client, ByteBuffer(string: "{}"))
            #expect(verify.status == .ok && verify.headers[.contentType] == "application/json")
            let check = try await Self.post(client, ByteBuffer(string: #"{"adapty_check": "c0ffee"}"#))
            #expect(JobSystem.json(check)["adapty_check_response"] as? String == "c0ffee")
            // An event type this backend does not act on, and an event without customer_user_id: 200, counted, nothing changes
            let renewalOff = try await Self.post(client, Self.event("subscription_renewal_cancelled", user: sub))
            #expect(renewalOff.status == .ok && JobSystem.json(renewalOff)["result"] as? String == "ignored")
            let anonymous = try await Self.post(client, Self.event("subscription_started", user: nil))
            #expect(anonymous.status == .ok && JobSystem.json(anonymous)["result"] as? String == "ignored")
            #expect(try await Self.me(client, user)["isPro"] as? Bool == false)
            let counts = JobSystem.json(try await client.execute(uri: "/admin/v1/webhooks/adapty", method: .get,
                                                                 headers: [.authorization: "Bearer \(JobSystem.adminToken)"]))
            #expect(counts["ignored"] as? Int == 2)
            // Garbage is 400, not applied
            #expect(try await Self.post(client, ByteBuffer(string: "not json")).status == .badRequest)
            let badTime = try await Self.post(client, ByteBuffer(string: #"{"customer_user_id": "\#(sub)", "event_type": "subscription_started", "event_datetime": "yesterday"}"#))
            #expect(badTime.status == .badRequest)

            // The same event twice: applied once
            let id = UUID().uuidString
            let now = Date()
            let first = try await Self.post(client, Self.event("subscription_started", user: sub, id: id, at: now, expiresAt: now.addingTimeInterval(86_400)))
            let again = try await Self.post(client, Self.event("subscription_started", user: sub, id: id, at: now, expiresAt: now.addingTimeInterval(86_400)))
            #expect(JobSystem.json(first)["result"] as? String == "applied" && JobSystem.json(again)["result"] as? String == "duplicate")
            // An older event after a newer one: ignored
            let stale = try await Self.post(client, Self.event("subscription_expired", user: sub, at: now.addingTimeInterval(-3600)))
            #expect(stale.status == .ok && JobSystem.json(stale)["result"] as? String == "stale")
            #expect(try await Self.me(client, user)["isPro"] as? Bool == true)
            // An access level turned off (its own shape: is_active false): free
            let off = ByteBuffer(string: """
                {"customer_user_id": "\(sub)", "event_type": "access_level_updated", "event_datetime": "\(Self.adaptyTime(now.addingTimeInterval(60)))",
                 "event_properties": {"profile_event_id": "\(UUID().uuidString)", "access_level_id": "premium", "is_active": false}}
                """)
            #expect(JobSystem.json(try await Self.post(client, off))["result"] as? String == "applied")
            #expect(try await Self.me(client, user)["isPro"] as? Bool == false)
        }
        await system.stop()
    }
}
