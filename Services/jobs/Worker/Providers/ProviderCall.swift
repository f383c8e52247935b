import AsyncHTTPClient
import Foundation
import Metrics
import NIOCore
import NIOHTTP1

/// One model call's HTTP, the same for every provider: each request is sent until it gets an
/// answer that is not "later", within the call's deadline.
///
/// - 429, and 5xx with `Retry-After` (or OpenAI's `retry-after-ms`), are sent again after the
///   time the provider asks (capped by the deadline), however many times: such waits are the
///   provider's pacing, not the job's failure, and use none of its attempts.
/// - 5xx without `Retry-After` and transport errors are sent again twice, after 1 and 2 s.
/// - Past the deadline the call fails as retryable ("the model did not answer within ...").
///
/// Metrics by provider and model: `worker_provider_requests_total{status}` (the HTTP status, or
/// `error`), `worker_provider_request_seconds`, `worker_provider_rate_limit_waits_total`.
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

    var expired: EffectError { EffectError("the model did not answer within \(timeoutText)", retryable: true) }

    /// Sends `make()` (a fresh request each time: a body is consumed once) until an answer that
    /// is not "later"; its body is read up to `maxBytes`.
    func send(maxBytes: Int = 64 << 20, _ make: () throws -> HTTPClientRequest) async throws -> Answer {
        var failures = 0
        while true {
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else { throw expired }
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
                    throw ContinuousClock.now >= deadline ? expired : EffectError("\(provider) could not be reached: \(EffectRunner.describe(error))", retryable: true)
                }
                try await Task.sleep(for: .seconds(failures))
                continue
            }
            count(String(answer.status))
            let later = answer.status == 429 || (500...599).contains(answer.status)
            guard later else { return answer }
            if let wait = Self.retryAfter(answer.headers) {
                // The provider's own pacing: wait as asked, without using up an attempt.
                Counter(label: "worker_provider_rate_limit_waits_total", dimensions: dimensions).increment()
                guard ContinuousClock.now.advanced(by: wait) < deadline else { throw expired }
                try await Task.sleep(for: wait)
                continue
            }
            if answer.status == 429 {
                // Rate-limited with no time given: back off, within the deadline.
                Counter(label: "worker_provider_rate_limit_waits_total", dimensions: dimensions).increment()
                failures += 1
                let wait = Duration.seconds(min(30, 1 << min(failures, 5)))
                guard ContinuousClock.now.advanced(by: wait) < deadline else { throw expired }
                try await Task.sleep(for: wait)
                continue
            }
            failures += 1
            guard failures <= 2, ContinuousClock.now.advanced(by: .seconds(failures)) < deadline else {
                throw EffectError("\(provider) answered \(answer.status)\(Self.message(answer.body).map { ": \($0)" } ?? "")", retryable: true)
            }
            try await Task.sleep(for: .seconds(failures))
        }
    }

    var dimensions: [(String, String)] { [("provider", provider), ("model", model)] }

    func count(_ status: String) {
        Counter(label: "worker_provider_requests_total", dimensions: dimensions + [("status", status)]).increment()
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

    /// The error message in a provider's JSON error body (`{"error": {"message"}}` for Gemini
    /// and OpenAI, `{"detail"}` for fal), shortened; nil when there is none. Never the body
    /// itself: it might echo what we sent.
    static func message(_ body: Data) -> String? {
        struct Google: Decodable { struct Inner: Decodable { var message: String? }; var error: Inner? }
        struct Fal: Decodable { var detail: String? }
        let text = (try? JSONDecoder().decode(Google.self, from: body))?.error?.message ?? (try? JSONDecoder().decode(Fal.self, from: body))?.detail
        return text.map { String($0.prefix(200)) }
    }

    /// A definite error status as a job failure: the key refused (never quoting the provider's
    /// message, which may show part of the key), or the request refused as malformed.
    func failure(_ answer: Answer) -> EffectError {
        switch answer.status {
        case 401, 403: return EffectError("\(provider) refused our API key (\(answer.status)); the operator must check it", retryable: false)
        case 404: return EffectError("\(provider) does not know the model \(model) (404)", retryable: false)
        default: return EffectError("\(provider) refused the request (\(answer.status))\(Self.message(answer.body).map { ": \($0)" } ?? "")", retryable: false)
        }
    }
}
