import Foundation
import HTTPTypes
import Messages

/// The one place quota state becomes HTTP: the IETF draft `RateLimit-Policy` / `RateLimit`
/// headers, and the 429 problem for a denial.
public enum RateLimitHeaders {
    /// `RateLimit-Policy: "daily";q=20;w=86400, "monthly";q=600;w=2592000` and
    /// `RateLimit: "daily";r=5;t=3600, "monthly";r=580;t=...` for the windows that have a limit.
    public static func headers(for status: QuotaStatus, now: Date) -> HTTPFields {
        let limited = [status.daily, status.monthly].filter { $0.limit != nil }
        var fields = HTTPFields()
        guard !limited.isEmpty else { return fields }
        fields[.rateLimitPolicy] = limited
            .map { "\"\($0.name)\";q=\($0.limit!);w=\($0.nominalSeconds)" }
            .joined(separator: ", ")
        fields[.rateLimit] = limited
            .map { "\"\($0.name)\";r=\($0.remaining ?? 0);t=\(secondsUntil($0.resetsAt, from: now))" }
            .joined(separator: ", ")
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
