import Bus
import Foundation
import Logging
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import JWTKit
import Messages
import ServiceKit
import Testing

/// Claims as the app's identity provider would sign them.
struct TestClaims: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    var email: String?
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

@Suite("Gateway identity, users/me and admin routes", .serialized, .timeLimit(.minutes(5)))
struct GatewayQuotaTests {
    static let secret = "test-secret-\(UUID().uuidString)"
    static let adminToken = "admin-\(UUID().uuidString)"

    func token(sub: String, email: String? = nil, expiresIn: TimeInterval = 3600, secret: String = secret) async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return try await keys.sign(TestClaims(sub: .init(value: sub), exp: .init(value: Date().addingTimeInterval(expiresIn)), email: email))
    }

    /// The gateway wired to a real quota process.
    func withGateway(_ body: @Sendable (any TestClientProtocol, BusClient) async throws -> Void) async throws {
        let services = try RunningServices(only: [.quota])
        let configuration = try GatewayConfiguration(environment: Environment(
            ["JWT_SECRET": Self.secret, "ADMIN_TOKEN": Self.adminToken].merging(services.endpointVariables) { _, new in new }
        ))
        let clients = ServiceClients(configuration: configuration)
        do {
            try await clients.running {
                _ = try await waitUntilHealthy(clients.quota)
                let authenticator = try await Authenticator(jwtSecret: Self.secret, adminToken: Self.adminToken)
                let streams = JobStreams(jobs: clients.jobs, perUser: configuration.streamsPerUser, total: configuration.streamsTotal, logger: Logger(label: "test"))
                let app = Application(router: buildRouter(clients: clients, authenticator: authenticator, configuration: configuration, streams: streams), services: [streams])
                try await app.test(.router) { client in try await body(client, clients.quota) }
            }
        } catch {
            await services.stopAll()
            throw error
        }
        await services.stopAll()
    }

    func json(_ response: TestResponse) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any])
    }

    @Test func missingMalformedExpiredAndBadlySignedCredentialsAre401() async throws {
        let expired = try await token(sub: "u1", expiresIn: -60)
        let forged = try await token(sub: "u1", secret: "not-the-secret-but-just-as-long-as-one")
        try await withGateway { client, _ in
            let cases: [(String, HTTPFields)] = [
                ("missing", [:]),
                ("malformed", [.authorization: "Bearer not.a.jwt"]),
                ("not bearer", [.authorization: "Basic dXNlcjpwYXNz"]),
                ("empty bearer", [.authorization: "Bearer "]),
                ("expired", [.authorization: "Bearer \(expired)"]),
                ("badly signed", [.authorization: "Bearer \(forged)"]),
                ("bad device id", [.deviceId: "not-a-uuid"]),
            ]
            for (name, headers) in cases {
                try await client.execute(uri: "/api/v1/users/me", method: .get, headers: headers) { response in
                    #expect(response.status == .unauthorized, "\(name)")
                    #expect(response.headers[.contentType] == "application/problem+json", "\(name)")
                }
            }
        }
    }

    @Test func signedInUserSeesTheirOwnQuotaWithRateLimitHeaders() async throws {
        let alice = try await token(sub: "alice", email: "alice@example.com")
        try await withGateway { client, quota in
            // Given alice has 3 charges and bob has 5
            for index in 0..<3 { _ = try await quota.call(Quota.reserve, ReserveQuota(userId: "alice", jobId: "a\(index)")) }
            for index in 0..<5 { _ = try await quota.call(Quota.reserve, ReserveQuota(userId: "bob", jobId: "b\(index)")) }
            // When alice asks who she is
            try await client.execute(uri: "/api/v1/users/me", method: .get, headers: [.authorization: "Bearer \(alice)"]) { response in
                // Then she sees her own counts only, and the quota headers
                #expect(response.status == .ok)
                let body = try json(response)
                #expect(body["id"] as? String == "alice")
                #expect(body["email"] as? String == "alice@example.com")
                #expect(body["isPro"] as? Bool == false)
                #expect(body["plan"] as? String == "free")
                let quota = try #require(body["quota"] as? [String: Any])
                #expect(quota["dailyRemaining"] as? Int == 17)
                #expect(quota["dailyLimit"] as? Int == 20)
                #expect(quota["monthlyRemaining"] as? Int == 597)
                #expect(quota["monthlyLimit"] as? Int == 600)
                #expect(quota["dailyResetsAt"] is String)
                #expect(response.headers[.init("RateLimit-Policy")!] == "\"daily\";q=20;w=86400, \"monthly\";q=600;w=2592000")
                let rateLimit = try #require(response.headers[.init("RateLimit")!])
                #expect(rateLimit.hasPrefix("\"daily\";r=17;t="))
            }
        }
    }

    @Test func guestIsKnownByDeviceId() async throws {
        let device = UUID()
        try await withGateway { client, quota in
            _ = try await quota.call(Quota.reserve, ReserveQuota(userId: "device:\(device.uuidString.lowercased())", jobId: "g1"))
            try await client.execute(uri: "/api/v1/users/me", method: .get, headers: [.deviceId: device.uuidString]) { response in
                #expect(response.status == .ok)
                let body = try json(response)
                #expect(body["id"] as? String == "device:\(device.uuidString.lowercased())")
                #expect(body["isGuest"] as? Bool == true)
                #expect((body["quota"] as? [String: Any])?["dailyRemaining"] as? Int == 19)
            }
        }
    }

    @Test func planChangeToProShowsAtOnceWithNullMonthlyLimit() async throws {
        let carol = try await token(sub: "carol")
        try await withGateway { client, _ in
            // When the admin moves carol to pro in Berlin
            let change = ByteBuffer(string: #"{"plan": "pro", "timeZone": "Europe/Berlin"}"#)
            try await client.execute(uri: "/admin/v1/users/carol/plan", method: .put, headers: [.authorization: "Bearer \(Self.adminToken)"], body: change) { response in
                #expect(response.status == .ok)
            }
            // Then her very next users/me shows pro limits
            try await client.execute(uri: "/api/v1/users/me", method: .get, headers: [.authorization: "Bearer \(carol)"]) { response in
                let body = try json(response)
                #expect(body["isPro"] as? Bool == true)
                #expect(body["plan"] as? String == "pro")
                #expect(body["timeZone"] as? String == "Europe/Berlin")
                let quota = try #require(body["quota"] as? [String: Any])
                #expect(quota["dailyLimit"] as? Int == 500)
                // No monthly limit of its own: 30 days of 500, less what the month used (the app's
                // model holds it as a non-optional integer); the policy header names only the day's
                let used = try #require(quota["monthlyUsed"] as? Int)
                #expect(quota["monthlyLimit"] as? Int == 15_000)
                #expect(quota["monthlyRemaining"] as? Int == 15_000 - used)
                #expect(response.headers[.init("RateLimit-Policy")!] == "\"daily\";q=500;w=86400")
            }
        }
    }

    @Test func adminRoutesRefuseUserTokensAndCheckTheirInput() async throws {
        let alice = try await token(sub: "alice")
        try await withGateway { client, quota in
            _ = try await quota.call(Quota.reserve, ReserveQuota(userId: "dave", jobId: "d1"))
            try await client.execute(uri: "/admin/v1/users/dave/usage", method: .get, headers: [.authorization: "Bearer \(alice)"]) { response in
                #expect(response.status == .forbidden)
            }
            try await client.execute(uri: "/admin/v1/users/dave/usage", method: .get) { response in
                #expect(response.status == .unauthorized)
            }
            try await client.execute(uri: "/admin/v1/users/dave/usage", method: .get, headers: [.authorization: "Bearer \(Self.adminToken)"]) { response in
                #expect(response.status == .ok)
                let body = try json(response)
                #expect((body["charges"] as? [Any])?.count == 1)
                #expect(((body["status"] as? [String: Any])?["daily"] as? [String: Any])?["used"] as? Int == 1)
            }
            let admin: HTTPFields = [.authorization: "Bearer \(Self.adminToken)"]
            let bodies: [(String, HTTPResponse.Status)] = [
                (#"{"plan": "platinum"}"#, .unprocessableContent),
                (#"{"plan": "pro", "timeZone": "Mars/Base"}"#, .unprocessableContent),
                (#"{"plan": 7}"#, .badRequest),
                (#"{"timeZone": "UTC"}"#, .badRequest),
                ("{not json", .badRequest),
                (String(repeating: " ", count: 70_000) + "{}", .contentTooLarge),
            ]
            for (text, expected) in bodies {
                try await client.execute(uri: "/admin/v1/users/dave/plan", method: .put, headers: admin, body: ByteBuffer(string: text)) { response in
                    #expect(response.status == expected, "\(text.prefix(40))")
                }
            }
            // Nothing changed dave's plan.
            let status = try await quota.call(Quota.status, UserReference(userId: "dave"))
            #expect(status.plan == "free")
        }
    }
}

@Suite("Quota denial mapping", .timeLimit(.minutes(5)))
struct RateLimitMappingTests {
    @Test func denialIs429NamingTheWindowsWithRetryAfterAndDraftHeaders() throws {
        let now = try Date("2026-11-21T23:00:00Z", strategy: .iso8601)
        let midnight = try Date("2026-11-22T00:00:00Z", strategy: .iso8601)
        let monthEnd = try Date("2026-12-01T00:00:00Z", strategy: .iso8601)
        let status = QuotaStatus(
            userId: "u", plan: "free", isPro: false, timeZone: nil,
            daily: QuotaWindow(name: "daily", limit: 20, used: 20, remaining: 0, startsAt: now, resetsAt: midnight, nominalSeconds: 86_400),
            monthly: QuotaWindow(name: "monthly", limit: 600, used: 300, remaining: 300, startsAt: now, resetsAt: monthEnd, nominalSeconds: 2_592_000)
        )
        let problem = RateLimitHeaders.problem(for: QuotaDecision(admitted: false, jobId: "j", status: status, violated: ["daily"], retryAt: midnight), now: now)
        #expect(problem.status == .tooManyRequests)
        #expect(problem.headers[.retryAfter] == "3600")
        #expect(problem.headers[.rateLimitPolicy] == "\"daily\";q=20;w=86400, \"monthly\";q=600;w=2592000")
        #expect(problem.headers[.rateLimit] == "\"daily\";r=0;t=3600, \"monthly\";r=300;t=781200")
        #expect(problem.extensions["violated-policies"] == .strings(["daily"]))
        let response = problem.response(requestId: "r1")
        #expect(response.headers[.contentType] == "application/problem+json")
    }

    /// The headers of an answer that admits: only the windows with a limit are named (PRO has no
    /// monthly one), in order, and a plan with neither sends none.
    @Test func headersNameOnlyTheWindowsWithALimit() throws {
        let now = try Date("2026-11-21T23:00:00Z", strategy: .iso8601)
        let midnight = try Date("2026-11-22T00:00:00Z", strategy: .iso8601)
        let monthEnd = try Date("2026-12-01T00:00:00Z", strategy: .iso8601)
        func status(daily: Int?, monthly: Int?) -> QuotaStatus {
            QuotaStatus(
                userId: "u", plan: "p", isPro: daily == 500, timeZone: nil,
                daily: QuotaWindow(name: "daily", limit: daily, used: 3, remaining: daily.map { $0 - 3 }, startsAt: now, resetsAt: midnight, nominalSeconds: 86_400),
                monthly: QuotaWindow(name: "monthly", limit: monthly, used: 3, remaining: monthly.map { $0 - 3 }, startsAt: now, resetsAt: monthEnd, nominalSeconds: 2_592_000)
            )
        }
        let free = RateLimitHeaders.headers(for: status(daily: 20, monthly: 600), now: now)
        #expect(free[.rateLimitPolicy] == "\"daily\";q=20;w=86400, \"monthly\";q=600;w=2592000")
        #expect(free[.rateLimit] == "\"daily\";r=17;t=3600, \"monthly\";r=597;t=781200")
        let pro = RateLimitHeaders.headers(for: status(daily: 500, monthly: nil), now: now)
        #expect(pro[.rateLimitPolicy] == "\"daily\";q=500;w=86400")
        #expect(pro[.rateLimit] == "\"daily\";r=497;t=3600")
        let monthlyOnly = RateLimitHeaders.headers(for: status(daily: nil, monthly: 600), now: now)
        #expect(monthlyOnly[.rateLimitPolicy] == "\"monthly\";q=600;w=2592000")
        #expect(monthlyOnly[.rateLimit] == "\"monthly\";r=597;t=781200")
        #expect(RateLimitHeaders.headers(for: status(daily: nil, monthly: nil), now: now).isEmpty)
    }
}
