import AsyncHTTPClient
import Foundation
import Metrics
import NIOCore
import NIOHTTP1

/// One model call's HTTP, the same for every provider: each request is sent until it gets an
/// answer that is not "later", within the call's deadline.
///
/// - An answer that says waiting will not help (a key refused, an account out of money: see
///   `ProviderSignal`) is returned at once, whatever its status, for the adapter to fail for good.
/// - 429, and 5xx with `Retry-After` (or OpenAI's `retry-after-ms`, or Gemini's
///   `RetryInfo.retryDelay` in the body), are sent again after the time the provider asks (capped
///   by the deadline), however many times: such waits are the provider's pacing, not the job's
///   failure, and use none of its attempts.
/// - 5xx without a wait and transport errors are sent again twice, after 1 and 2 s.
/// - Past the deadline the call fails as retryable ("the model did not answer within ...").
///
/// Metrics by provider and model: `worker_provider_requests_total{status}` (the HTTP status, or
/// `error`), `worker_provider_request_seconds`, `worker_provider_rate_limit_waits_total`; by
/// provider, `worker_provider_errors_total{kind}` (`key`, `billing`, `rate_limit`, `server`,
/// `unreachable`, `timeout`, `refused`).
struct ProviderCall: Sendable {
    let provider: String
    let model: String
    let deadline: ContinuousClock.Instant
    let timeoutText: String

    init(provider: String, model: String, timeout: Duration, from start: ContinuousClock.Instant = .now) {
        self.provider = provider
        self.model = model
        self.deadline = start.advanced(by: timeout)
        self.timeoutText = "\(timeout.components.seconds) s"
    }

    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: Data
    }

    /// The call ran out of time (counted as a `timeout`).
    func expired() -> EffectError {
        countError("timeout")
        return EffectError("the model did not answer within \(timeoutText)", retryable: true)
    }

    /// The provider asked for a wait that ends past this attempt's deadline.
    func waitPastDeadline(_ wait: Duration) -> EffectError {
        countError("timeout")
        return EffectError("\(provider) asked to wait \(Self.describe(wait)) before trying again, past the model's timeout of \(timeoutText)", retryable: true)
    }

    /// Sends `make()` (a fresh request each time: a body is consumed once) until an answer that
    /// is not "later"; its body is read up to `maxBytes`.
    func send(maxBytes: Int = 64 << 20, _ make: () throws -> HTTPClientRequest) async throws -> Answer {
        var failures = 0
        while true {
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else { throw expired() }
            let started = ContinuousClock.now
            let answer: Answer
            do {
                let response = try await WorkerHTTP.execute(try make(), timeout: .nanoseconds(Int64(remaining / .nanoseconds(1))))
                let body = try await response.body.collect(upTo: maxBytes)
                answer = Answer(status: Int(response.status.code), headers: response.headers, body: Data(body.readableBytesView))
                Metrics.Timer(label: "worker_provider_request_seconds", dimensions: dimensions).record(started.duration(to: .now))
            } catch let error as EffectError {
                throw error
            } catch {
                count("error")
                if Task.isCancelled { throw CancellationError() }
                if error is NIOTooManyBytesError {
                    throw EffectError("the \(provider) answer was over \(maxBytes) bytes", retryable: false)
                }
                failures += 1
                guard failures <= 2, ContinuousClock.now.duration(to: deadline) > .seconds(failures) else {
                    if ContinuousClock.now >= deadline { throw expired() }
                    countError("unreachable")
                    throw EffectError("\(provider) could not be reached: \(EffectRunner.describe(error))", retryable: true)
                }
                try await Task.sleep(for: .seconds(failures))
                continue
            }
            count(String(answer.status))
            let later = answer.status == 429 || (500...599).contains(answer.status)
            guard later else { return answer }
            let signal = ProviderSignal.read(status: answer.status, body: answer.body)
            // A 429 for want of money (OpenAI's `insufficient_quota`) will not clear by waiting.
            guard signal.kind == nil else { return answer }
            countError(answer.status == 429 ? "rate_limit" : "server")
            if let wait = Self.retryAfter(answer.headers) ?? signal.retryDelay {
                // The provider's own pacing: wait as asked, without using up an attempt.
                Counter(label: "worker_provider_rate_limit_waits_total", dimensions: dimensions).increment()
                guard ContinuousClock.now.advanced(by: wait) < deadline else { throw waitPastDeadline(wait) }
                try await Task.sleep(for: wait)
                continue
            }
            if answer.status == 429 {
                // Rate-limited with no time given: back off, within the deadline.
                Counter(label: "worker_provider_rate_limit_waits_total", dimensions: dimensions).increment()
                failures += 1
                let wait = Duration.seconds(min(30, 1 << min(failures, 5)))
                guard ContinuousClock.now.advanced(by: wait) < deadline else { throw expired() }
                try await Task.sleep(for: wait)
                continue
            }
            failures += 1
            guard failures <= 2, ContinuousClock.now.advanced(by: .seconds(failures)) < deadline else {
                throw EffectError("\(provider) answered \(answer.status)\(signal.message.map { ": \($0)" } ?? "")", retryable: true)
            }
            try await Task.sleep(for: .seconds(failures))
        }
    }

    var dimensions: [(String, String)] { [("provider", provider), ("model", model)] }

    func count(_ status: String) {
        Counter(label: "worker_provider_requests_total", dimensions: dimensions + [("status", status)]).increment()
    }

    func countError(_ kind: String) {
        Counter(label: "worker_provider_errors_total", dimensions: [("provider", provider), ("kind", kind)]).increment()
    }

    /// A wait as an operator reads it: `2.5 s`, `40 s`, `2 min`, `10 h`.
    static func describe(_ wait: Duration) -> String {
        let seconds = Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18
        if seconds >= 7200 { return "\(Int(seconds / 3600)) h" }
        if seconds >= 120 { return "\(Int(seconds / 60)) min" }
        if seconds < 10, seconds.rounded() != seconds { return "\((seconds * 10).rounded() / 10) s" }
        return "\(Int(seconds.rounded())) s"
    }

    /// A refusal for safety: counted, and the short message the app shows.
    func refusal() -> EffectError {
        Counter(label: "worker_provider_refusals_total", dimensions: dimensions).increment()
        return EffectError(EffectRunner.refusalMessage, retryable: false)
    }

    /// The wait a `Retry-After` (seconds or an HTTP date) or `retry-after-ms` asks for, at most
    /// ten minutes; nil when there is none.
    static func retryAfter(_ headers: HTTPHeaders, now: Date = Date()) -> Duration? {
        if let ms = headers.first(name: "retry-after-ms").flatMap(Double.init), ms >= 0 {
            return .milliseconds(Int64(min(ms, 600_000)))
        }
        guard let value = headers.first(name: "Retry-After")?.trimmingCharacters(in: .whitespaces) else { return nil }
        if let seconds = Double(value), seconds >= 0 { return .milliseconds(Int64(min(seconds, 600) * 1000)) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return .milliseconds(Int64(min(max(0, date.timeIntervalSince(now)), 600) * 1000))
    }

    /// A definite error answer as a job failure, for good: the key refused, or the account out of
    /// money (never quoting the provider's message, which may show part of the key, and is for the
    /// operator, not the app's user), an unknown model, or the request refused as malformed.
    func failure(_ answer: Answer) -> EffectError {
        let signal = ProviderSignal.read(status: answer.status, body: answer.body)
        switch signal.kind {
        case .key:
            countError("key")
            return EffectError("\(provider) refused our API key (\(answer.status)); the operator must check it", retryable: false)
        case .billing:
            countError("billing")
            return EffectError("\(provider) refused for billing (\(answer.status): the account's credit or spend limit is used up); the operator must check the \(provider) account", retryable: false)
        case nil:
            countError("refused")
            if answer.status == 404 { return EffectError("\(provider) does not know the model \(model) (404)", retryable: false) }
            return EffectError("\(provider) refused the request (\(answer.status))\(signal.message.map { ": \($0)" } ?? "")", retryable: false)
        }
    }
}

/// What a provider's error answer says beyond its status, read as each provider documents it.
///
/// - Gemini (ai.google.dev/gemini-api/docs/troubleshooting, and Google's error model,
///   google.aip.dev/193): `{"error": {"code", "message", "status", "details": [...]}}`, where a
///   detail of `@type` `type.googleapis.com/google.rpc.RetryInfo` carries `retryDelay` (a JSON
///   `Duration`, `"5s"`, `"0.5s"`: "clients should wait at least this long between retrying the
///   same request"), and one of `type.googleapis.com/google.rpc.ErrorInfo` a `reason`. A 429
///   carries no `Retry-After` header: the wait is only in the body. An invalid key is a 400
///   `INVALID_ARGUMENT` whose reason is `API_KEY_INVALID` (other `API_KEY_*` reasons: a key
///   blocked for the service, the address or the referrer), not a 401 or 403; a project without
///   billing is reason `BILLING_DISABLED`.
/// - OpenAI (platform.openai.com/docs/guides/error-codes): `{"error": {"message", "type",
///   "param", "code"}}`. A 429 is either a rate limit (`rate_limit_exceeded`, which clears) or the
///   account out of money: type `insufficient_quota` ("You exceeded your current quota, please
///   check your plan and billing details"), with codes such as `insufficient_quota`,
///   `credit_balance_exhausted` or `project_spend_limit_exceeded`, which does not. A bad key is
///   401 `invalid_api_key`; `billing_hard_limit_reached` is a 400.
/// - fal (docs.fal.ai, "Errors"): `{"detail": ...}`; an account out of balance is a 403 whose
///   detail reads "User is locked. Reason: Exhausted balance. Top up your balance at
///   fal.ai/dashboard/billing." (or "Reason: TOP_UP"): billing, not the key.
///
/// A 401 or 403 that is not billing is the key.
struct ProviderSignal: Equatable {
    enum Kind: String, Equatable {
        /// The key is refused: only the operator can fix it.
        case key
        /// The account has no credit left or hit its spend limit: only the operator can fix it.
        case billing
    }

    /// A failure that waiting will not clear.
    var kind: Kind?
    /// The wait the provider asks for in its body.
    var retryDelay: Duration?
    /// The error message in the body (`error.message` for Gemini and OpenAI, a string `detail`
    /// for fal), shortened to 200 characters; never the body itself, which might echo what we
    /// sent. Not for the app's user when the key is refused (OpenAI's shows part of the key).
    var message: String?

    static let openAIBillingCodes: Set<String> = [
        "insufficient_quota", "billing_hard_limit_reached", "credit_balance_exhausted", "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded", "organization_usage_limit_exceeded",
    ]

    static func read(status: Int, body: Data) -> ProviderSignal {
        var signal = ProviderSignal()
        let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        if let error = object?["error"] as? [String: Any] {
            for detail in error["details"] as? [[String: Any]] ?? [] {
                switch detail["@type"] as? String {
                case "type.googleapis.com/google.rpc.RetryInfo":
                    signal.retryDelay = (detail["retryDelay"] as? String).flatMap(duration)
                case "type.googleapis.com/google.rpc.ErrorInfo":
                    let reason = detail["reason"] as? String ?? ""
                    if reason.hasPrefix("API_KEY_") { signal.kind = .key }
                    if reason == "BILLING_DISABLED" { signal.kind = .billing }
                default: break
                }
            }
            let type = error["type"] as? String, code = error["code"] as? String
            if type == "insufficient_quota" || code.map(openAIBillingCodes.contains) == true { signal.kind = .billing }
            if code == "invalid_api_key" { signal.kind = .key }
        }
        let detail = object?["detail"] as? String
        signal.message = ((object?["error"] as? [String: Any])?["message"] as? String ?? detail).map { String($0.prefix(200)) }
        if status == 402 || (status == 403 && detail?.hasPrefix("User is locked") == true) { signal.kind = .billing }
        if signal.kind == nil, status == 401 || status == 403 { signal.kind = .key }
        return signal
    }

    /// A protobuf JSON `Duration` (`"5s"`, `"1.500s"`), at most a day (a wait past the model's
    /// timeout fails the attempt at once, saying how long the provider asked for).
    static func duration(_ text: String) -> Duration? {
        guard text.hasSuffix("s"), let seconds = Double(text.dropLast()), seconds >= 0, seconds.isFinite else { return nil }
        return .milliseconds(Int64(min(seconds, 86_400) * 1000))
    }
}
