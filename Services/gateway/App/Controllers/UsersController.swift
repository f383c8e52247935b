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
        let router = router.authenticated(by: authenticator)
        router.get("/api/v1/users/me") { _, context in
            let caller = context.caller
            let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
            return UsersJSON.response(UsersJSON.me(caller, status), status)
        }
        router.get("/api/v1/users/me/credits") { _, context in
            let caller = context.caller
            let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
            return UsersJSON.response(UsersJSON.credits(status), status)
        }
    }
}

/// The bodies of `users/me` and `users/me/credits`, written directly (no `JSONEncoder`).
enum UsersJSON {
    /// The quota members of both answers, keys in sorted order as `JSONEncoder` wrote them.
    ///
    /// The app's models (the Chat screen's `users/me`) hold every limit and remaining as a
    /// non-optional integer, so a window the plan has no limit for reports what the other
    /// window allows in it: PRO, with 500 a day and no monthly limit, has a month of 30 days of
    /// 500 (`monthlyLimit` 15,000, `monthlyRemaining` that less `monthlyUsed`); a plan with a
    /// monthly limit only may spend all of it in a day. Only a plan with neither has nulls. The
    /// `RateLimit-Policy` header names the plan's own limits only.
    enum QuotaJSON {
        static func daily(_ status: QuotaStatus, _ out: inout JSONBytes) {
            window(effective(status.daily, from: status.monthly), ("\"dailyLimit\":", ",\"dailyRemaining\":", ",\"dailyResetsAt\":", ",\"dailyUsed\":"), &out)
        }

        static func monthly(_ status: QuotaStatus, _ out: inout JSONBytes) {
            window(effective(status.monthly, from: status.daily), ("\"monthlyLimit\":", ",\"monthlyRemaining\":", ",\"monthlyResetsAt\":", ",\"monthlyUsed\":"), &out)
        }

        /// `window`, or where its plan has no limit, the limit `other` sets on it: as many of the
        /// other window's limit as fit in this one (at least one), and what of it is left.
        static func effective(_ window: QuotaWindow, from other: QuotaWindow) -> QuotaWindow {
            guard window.limit == nil, let otherLimit = other.limit else { return window }
            var derived = window
            let limit = otherLimit * max(1, window.nominalSeconds / max(1, other.nominalSeconds))
            derived.limit = limit
            derived.remaining = min(max(0, limit - window.used), window.nominalSeconds < other.nominalSeconds ? other.remaining ?? limit : limit)
            return derived
        }

        /// One window's four members, under the keys given (in sorted order).
        private static func window(
            _ window: QuotaWindow, _ keys: (limit: StaticString, remaining: StaticString, resetsAt: StaticString, used: StaticString),
            _ out: inout JSONBytes
        ) {
            out.raw(keys.limit)
            integer(window.limit, &out)
            out.raw(keys.remaining)
            integer(window.remaining, &out)
            out.raw(keys.resetsAt)
            out.date(window.resetsAt)
            out.raw(keys.used)
            out.integer(window.used)
        }

        static func integer(_ value: Int?, _ out: inout JSONBytes) {
            if let value { out.integer(value) } else { out.raw("null") }
        }
    }

    /// The quota object of `users/me`, with the plan: `{dailyLimit, dailyRemaining, dailyResetsAt,
    /// dailyUsed, isPro, monthlyLimit, monthlyRemaining, monthlyResetsAt, monthlyUsed, plan,
    /// planEndsAt?}`, written directly.
    static func credits(_ status: QuotaStatus) -> [UInt8] {
        var out = JSONBytes(capacity: 320)
        out.raw("{")
        QuotaJSON.daily(status, &out)
        out.raw(",\"isPro\":")
        out.bool(status.isPro)
        out.raw(",")
        QuotaJSON.monthly(status, &out)
        out.raw(",\"plan\":")
        out.string(status.plan)
        if let end = status.planEndsAt {
            out.raw(",\"planEndsAt\":")
            out.date(end)
        }
        out.raw("}")
        return out.bytes
    }

    /// The app's user: `{email?, id, isGuest, isPro, plan, planEndsAt?, quota: {...}, timeZone}`,
    /// written directly.
    static func me(_ caller: Caller, _ status: QuotaStatus) -> [UInt8] {
        var out = JSONBytes(capacity: 480)
        out.raw("{")
        if let email = caller.email {
            out.raw("\"email\":")
            out.string(email)
            out.raw(",")
        }
        out.raw("\"id\":")
        out.string(caller.id)
        out.raw(",\"isGuest\":")
        out.bool(caller.isGuest)
        out.raw(",\"isPro\":")
        out.bool(status.isPro)
        out.raw(",\"plan\":")
        out.string(status.plan)
        if let end = status.planEndsAt {
            out.raw(",\"planEndsAt\":")
            out.date(end)
        }
        out.raw(",\"quota\":{")
        QuotaJSON.daily(status, &out)
        out.raw(",")
        QuotaJSON.monthly(status, &out)
        out.raw("},\"timeZone\":")
        out.string(status.timeZone ?? "UTC")
        out.raw("}")
        return out.bytes
    }

    static func response(_ bytes: [UInt8], _ status: QuotaStatus) -> Response {
        var headers = RateLimitHeaders.headers(for: status, now: Date())
        headers.append(HTTPField(name: .contentType, value: "application/json"))
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}
