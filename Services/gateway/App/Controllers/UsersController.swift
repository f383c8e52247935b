import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// `GET /api/v1/users/me`: who the caller is and their quota; `GET /api/v1/users/me/credits`:
/// the quota alone (the Chat screen's badge); both with the rate-limit headers.
struct UsersController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator

    func addRoutes(to router: Router<Context>) {
        let router = router.group().add(middleware: AuthenticationMiddleware(authenticator: authenticator))
        router.get("/api/v1/users/me") { _, context in
            let caller = try context.caller()
            let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
            let now = Date()
            return try JSONResponse.make(.ok, Me(caller: caller, status: status), headers: RateLimitHeaders.headers(for: status, now: now))
        }
        router.get("/api/v1/users/me/credits") { _, context in
            let caller = try context.caller()
            let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
            return try JSONResponse.make(.ok, Credits(status: status), headers: RateLimitHeaders.headers(for: status, now: Date()))
        }
    }

    /// The quota object of `users/me`, with the plan: `{isPro, plan, planEndsAt?, dailyRemaining,
    /// dailyLimit, dailyUsed, monthlyRemaining, monthlyLimit, monthlyUsed, dailyResetsAt,
    /// monthlyResetsAt}`.
    struct Credits: Encodable {
        var status: QuotaStatus

        enum Keys: String, CodingKey { case isPro, plan, planEndsAt }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(status.isPro, forKey: .isPro)
            try container.encode(status.plan, forKey: .plan)
            try container.encodeIfPresent(status.planEndsAt, forKey: .planEndsAt)
            try Me.encodeQuota(status, to: encoder.container(keyedBy: Me.QuotaKeys.self))
        }
    }

    /// The app's user: `{id, email?, isPro, plan, quota: {...}}`; a limit the plan lacks is null.
    struct Me: Encodable {
        var caller: Caller
        var status: QuotaStatus

        enum Keys: String, CodingKey { case id, email, isGuest, isPro, plan, planEndsAt, timeZone, quota }
        enum QuotaKeys: String, CodingKey {
            case dailyRemaining, dailyLimit, dailyUsed, monthlyRemaining, monthlyLimit, monthlyUsed, dailyResetsAt, monthlyResetsAt
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(caller.id, forKey: .id)
            try container.encodeIfPresent(caller.email, forKey: .email)
            try container.encode(caller.isGuest, forKey: .isGuest)
            try container.encode(status.isPro, forKey: .isPro)
            try container.encode(status.plan, forKey: .plan)
            try container.encodeIfPresent(status.planEndsAt, forKey: .planEndsAt)
            try container.encode(status.timeZone ?? "UTC", forKey: .timeZone)
            try Self.encodeQuota(status, to: container.nestedContainer(keyedBy: QuotaKeys.self, forKey: .quota))
        }

        static func encodeQuota(_ status: QuotaStatus, to container: KeyedEncodingContainer<QuotaKeys>) throws {
            var quota = container
            // `encode` of an Optional writes null, which the app reads as "no limit".
            try quota.encode(status.daily.remaining, forKey: .dailyRemaining)
            try quota.encode(status.daily.limit, forKey: .dailyLimit)
            try quota.encode(status.daily.used, forKey: .dailyUsed)
            try quota.encode(status.monthly.remaining, forKey: .monthlyRemaining)
            try quota.encode(status.monthly.limit, forKey: .monthlyLimit)
            try quota.encode(status.monthly.used, forKey: .monthlyUsed)
            try quota.encode(status.daily.resetsAt, forKey: .dailyResetsAt)
            try quota.encode(status.monthly.resetsAt, forKey: .monthlyResetsAt)
        }
    }
}
