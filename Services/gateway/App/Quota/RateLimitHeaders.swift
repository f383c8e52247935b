import Foundation
import HTTPTypes
import Messages

/// The one place quota state becomes HTTP: the IETF draft `RateLimit-Policy` / `RateLimit`
/// headers, and the 429 problem for a denial.
public enum RateLimitHeaders {
    /// `RateLimit-Policy: "daily";q=20;w=86400, "monthly";q=600;w=2592000` and
    /// `RateLimit: "daily";r=5;t=3600, "monthly";r=580;t=...` for the windows that have a limit.
    public static func headers(for status: QuotaStatus, now: Date) -> HTTPFields {
        // Written straight into two strings: every quota answer carries these headers, and
        // mapping the windows through interpolations and `joined` was 2% of the machine in
        // `bench-gateway`'s `users/me` (perf).
        var policy = "", remaining = ""
        policy.reserveCapacity(64)
        remaining.reserveCapacity(64)
        func add(_ window: QuotaWindow) {
            guard let limit = window.limit else { return }
            if !policy.isEmpty {
                policy += ", "
                remaining += ", "
            }
            policy += "\""
            policy += window.name
            policy += "\";q="
            policy += String(limit)
            policy += ";w="
            policy += String(window.nominalSeconds)
            remaining += "\""
            remaining += window.name
            remaining += "\";r="
            remaining += String(window.remaining ?? 0)
            remaining += ";t="
            remaining += String(secondsUntil(window.resetsAt, from: now))
        }
        add(status.daily)
        add(status.monthly)
        var fields = HTTPFields()
        guard !policy.isEmpty else { return fields }
        fields.reserveCapacity(3)
        fields.append(HTTPField(name: .rateLimitPolicy, value: policy))
        fields.append(HTTPField(name: .rateLimit, value: remaining))
        return fields
    }

    /// The 429 answer to a denied reservation: problem+json naming the violated windows, with
    /// `Retry-After` (seconds until a retry can succeed) and the rate-limit headers.
    /// `needed` is what the job costs: the answer says it, and how many credits are left (the
    /// least of the violated windows' remainders), so the app can say "this edit needs 4
    /// credits; you have 1".
    public static func problem(for decision: QuotaDecision, needed: Int? = nil, now: Date) -> Problem {
        problem(status: decision.status, violated: decision.violated, retryAt: decision.retryAt, needed: needed,
                networkRemaining: decision.networkRemaining, now: now)
    }

    /// The same 429 for a user with no room left in some window, before anything is charged
    /// (a presign at 0); nil when every window has room.
    public static func problem(ifExhausted status: QuotaStatus, now: Date) -> Problem? {
        let exhausted = [status.daily, status.monthly].filter { $0.remaining == 0 }
        guard !exhausted.isEmpty else { return nil }
        return problem(status: status, violated: exhausted.map(\.name), retryAt: exhausted.map(\.resetsAt).max(), now: now)
    }

    static func problem(status: QuotaStatus, violated: [String], retryAt: Date?, needed: Int? = nil, networkRemaining: Int? = nil, now: Date) -> Problem {
        var fields = headers(for: status, now: now)
        let retryAfter = retryAt.map { secondsUntil($0, from: now) } ?? 1
        fields[.retryAfter] = "\(retryAfter)"
        let names = violated.joined(separator: " and ")
        let windows = [status.daily, status.monthly].filter { violated.contains($0.name) }
        // `network`: the free credits a guest's network shares a day.
        let remaining = (windows.compactMap(\.remaining) + (violated.contains("network") ? [networkRemaining ?? 0] : [])).min() ?? 0
        var extensions: [String: ProblemValue] = [
            "violated-policies": .strings(violated),
            "retryAfter": .int(retryAfter),
            "plan": .string(status.plan),
            "creditsRemaining": .int(remaining),
        ]
        let detail: String
        if let needed {
            extensions["creditsNeeded"] = .int(needed)
            detail = "This edit needs \(needed) credit\(needed == 1 ? "" : "s") and \(remaining) \(remaining == 1 ? "is" : "are") left in the \(names) limit of the \(status.plan) plan; try again in \(retryAfter) seconds."
        } else {
            detail = "The \(names) edit limit of the \(status.plan) plan is used up; try again in \(retryAfter) seconds."
        }
        return Problem(
            .tooManyRequests,
            title: "Quota exceeded",
            detail: detail,
            type: "/problems/quota-exceeded",
            headers: fields,
            extensions: extensions
        )
    }

    /// Whole seconds from `now` to `instant`, rounded up, at least 0.
    static func secondsUntil(_ instant: Date, from now: Date) -> Int {
        max(0, Int(instant.timeIntervalSince(now).rounded(.up)))
    }
}

extension HTTPField.Name {
    public static let rateLimitPolicy = HTTPField.Name("RateLimit-Policy")!
    public static let rateLimit = HTTPField.Name("RateLimit")!
}
