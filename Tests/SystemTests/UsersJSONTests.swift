import Foundation
@testable import GatewayApp
import Messages
import Testing

/// `users/me` and `users/me/credits`, written by hand: byte for byte what `JSONEncoder` with sorted
/// keys and ISO 8601 dates wrote from the shapes below (the routes' shapes before they were
/// written directly, kept here as the reference).
@Suite("Users JSON", .timeLimit(.minutes(5)))
struct UsersJSONTests {
    static func status(pro: Bool, zone: String?, end: Date?) -> QuotaStatus {
        let start = Date(timeIntervalSince1970: 1_795_000_000)
        return QuotaStatus(
            userId: "device:u", plan: pro ? "pro" : "free", isPro: pro, timeZone: zone,
            daily: QuotaWindow(name: "daily", limit: pro ? 500 : 20, used: 7, remaining: pro ? 493 : 13, startsAt: start,
                               resetsAt: start.addingTimeInterval(86_400.5), nominalSeconds: 86_400),
            monthly: QuotaWindow(name: "monthly", limit: pro ? nil : 600, used: 31, remaining: pro ? nil : 569, startsAt: start,
                                 resetsAt: start.addingTimeInterval(2_592_000), nominalSeconds: 2_592_000),
            planEndsAt: end
        )
    }

    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    @Test func bothBodiesAreWhatJSONEncoderWroteForEveryKindOfUser() throws {
        for pro in [false, true] {
            for zone in [nil, "Europe/Berlin"] {
                for end in [nil, Date(timeIntervalSince1970: 1_796_000_000.9)] {
                    for caller in [Caller(id: "device:u", isGuest: true), Caller(id: "auth0|a\"b\\c", email: "ü@example.com")] {
                        let status = Self.status(pro: pro, zone: zone, end: end)
                        let me = String(decoding: UsersJSON.me(caller, status), as: UTF8.self)
                        #expect(me == String(decoding: try Self.encoder.encode(Me(caller: caller, status: status)), as: UTF8.self))
                        let credits = String(decoding: UsersJSON.credits(status), as: UTF8.self)
                        #expect(credits == String(decoding: try Self.encoder.encode(Credits(status: status)), as: UTF8.self))
                    }
                }
            }
        }
    }

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
            // A window the plan has no limit for, as the other window bounds it (tested on its own
            // in GatewayQuotaTests): here only the writing is held to JSONEncoder's.
            let daily = UsersJSON.QuotaJSON.effective(status.daily, from: status.monthly)
            let monthly = UsersJSON.QuotaJSON.effective(status.monthly, from: status.daily)
            try quota.encode(daily.remaining, forKey: .dailyRemaining)
            try quota.encode(daily.limit, forKey: .dailyLimit)
            try quota.encode(daily.used, forKey: .dailyUsed)
            try quota.encode(monthly.remaining, forKey: .monthlyRemaining)
            try quota.encode(monthly.limit, forKey: .monthlyLimit)
            try quota.encode(monthly.used, forKey: .monthlyUsed)
            try quota.encode(status.daily.resetsAt, forKey: .dailyResetsAt)
            try quota.encode(status.monthly.resetsAt, forKey: .monthlyResetsAt)
        }
    }
}
