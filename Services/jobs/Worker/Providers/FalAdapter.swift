import AsyncHTTPClient
import Foundation
import Messages
import Metrics
import NIOCore
import NIOHTTP1

/// fal.ai's queue API, for long generations (Veo-class video, and image models too): submit,
/// then status and result by request id; fal's webhook makes the worker ask at once, polling is
/// the safety net.
///
/// Shapes from fal's queue documentation (docs.fal.ai, "Queue" and the Queue API reference):
/// - submit: `POST {queue}/{model_id}?fal_webhook={url}` with the model's input as JSON and
///   `Authorization: Key {FAL_KEY}`; the answer `{"request_id", "response_url", "status_url",
///   "cancel_url", "queue_position"}`;
/// - status: `GET {status_url}`: `{"status": "IN_QUEUE" | "IN_PROGRESS" | "COMPLETED",
///   "queue_position"}`;
/// - result: `GET {response_url}`: the model's output, for video models
///   `{"video": {"url", "content_type"}}`, for image models `{"images": [{"url", "content_type"}]}`;
///   a failed generation answers an error status with `{"detail": ...}`, and one refused by the
///   content checker a 422 whose detail has `"type": "content_policy_violation"`;
/// - cancel: `PUT {cancel_url}`: 202 `{"status": "CANCELLATION_REQUESTED"}` (400 once done).
/// Images go in as data URIs (`image_url`), which fal's model APIs accept, so the provider
/// needs no access to our store.
struct FalAdapter: Sendable {
    let queueURL: String
    let key: String

    struct Submitted: Decodable {
        var request_id: String
        var response_url: String?
        var status_url: String?
        var cancel_url: String?
    }

    struct Status: Decodable {
        var status: String
        var queue_position: Int?
    }

    struct Output: Decodable {
        struct File: Decodable {
            var url: String
            var content_type: String?
        }
        var video: File?
        var image: File?
        var images: [File]?
    }

    struct Detail: Decodable {
        struct Item: Decodable { var type: String? }
        var detail: [Item]?
    }

    func authorized(_ url: String, method: HTTPMethod) -> HTTPClientRequest {
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: "Authorization", value: "Key \(key)")
        return request
    }

    /// Submits the job's input to the model's queue.
    func submit(_ image: Data, contentType: String, prompt: String, parameters: [String: Double], webhook: String?,
                call: ProviderCall, now: Date = Date()) async throws -> ProviderRequest {
        var input: [String: JSONValue] = ["prompt": .string(prompt), "image_url": .string("data:\(contentType);base64,\(image.base64EncodedString())")]
        for (name, value) in parameters { input[name] = .number(value) }
        let body = try JSONEncoder().encode(input)
        var url = "\(queueURL)/\(call.model)"
        if let webhook, let encoded = webhook.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) {
            url += "?fal_webhook=\(encoded)"
        }
        let answer = try await call.send {
            var request = authorized(url, method: .POST)
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body))
            return request
        }
        guard answer.status == 200 || answer.status == 202 else { throw refusalOrFailure(answer, call: call) }
        guard let submitted = try? JSONDecoder().decode(Submitted.self, from: answer.body), !submitted.request_id.isEmpty else {
            throw EffectError("fal answered the submission without a request_id", retryable: true)
        }
        let base = "\(queueURL)/\(call.model)/requests/\(submitted.request_id)"
        return ProviderRequest(
            provider: "fal", requestId: submitted.request_id,
            statusURL: submitted.status_url ?? base + "/status", responseURL: submitted.response_url ?? base,
            cancelURL: submitted.cancel_url ?? base + "/cancel", submittedAt: now
        )
    }

    /// Waits until the request is done (asking at every `wait()`, which returns early when fal's
    /// webhook came), then fetches and returns the output.
    func result(of request: ProviderRequest, call: ProviderCall, progress: @Sendable (Double) -> Void,
                wait: @Sendable () async throws -> Void) async throws -> ModelOutput {
        do {
            return try await poll(request, call: call, progress: progress, wait: wait)
        } catch let error as EffectError where ContinuousClock.now >= call.deadline && !Task.isCancelled {
            // Given up: fal is told first, so the next attempt starts once fal let go of this
            // generation (a timed-out generation left running is billed, and takes one of the
            // provider's places beside the next attempt's).
            if let output = await abandon(request, model: call.model) { return output }
            throw error
        }
    }

    func poll(_ request: ProviderRequest, call: ProviderCall, progress: @Sendable (Double) -> Void,
              wait: @Sendable () async throws -> Void) async throws -> ModelOutput {
        while true {
            let answer = try await call.send(maxBytes: 1 << 20) { authorized(request.statusURL, method: .GET) }
            if answer.status == 200 || answer.status == 202, let status = try? JSONDecoder().decode(Status.self, from: answer.body) {
                switch status.status {
                case "COMPLETED":
                    return try await output(of: request, call: call)
                case "IN_PROGRESS":
                    progress(0.5)
                default:
                    progress(0.2)
                }
            } else if answer.status == 404 {
                throw EffectError("fal no longer knows request \(request.requestId)", retryable: true)
            } else if answer.status != 200 {
                throw call.failure(answer)
            }
            guard ContinuousClock.now < call.deadline else { throw call.expired() }
            try await wait()
        }
    }

    /// How long giving a generation up may take: the cancel, then fal's status until it let go.
    static let abandonWait: Duration = .seconds(30)

    /// Cancels the request at fal and waits until fal let go of it (fal's queue documentation,
    /// "Cancel a request": `PUT {cancel_url}` answers 202 `CANCELLATION_REQUESTED`, and a request
    /// still in the queue is never run, a running one is told to stop; 400 `ALREADY_COMPLETED`
    /// once it finished). After a 202, its status is asked until `COMPLETED` (how a cancelled
    /// request ends, without output) or unknown. A generation that finished as it was given up is
    /// paid for: its output is returned and kept. Nil: let go, or not known within `abandonWait` (counted in
    /// `worker_provider_abandoned_total{provider, outcome}`: `let_go`, `finished`, `unconfirmed`).
    func abandon(_ request: ProviderRequest, model: String) async -> ModelOutput? {
        let call = ProviderCall(provider: "fal", model: model, timeout: Self.abandonWait)
        func counted(_ outcome: String) {
            Counter(label: "worker_provider_abandoned_total", dimensions: [("provider", "fal"), ("outcome", outcome)]).increment()
        }
        guard let url = request.cancelURL, let cancelled = try? await call.send(maxBytes: 1 << 16, { authorized(url, method: .PUT) }) else {
            counted("unconfirmed")
            return nil
        }
        if cancelled.status == 400 {
            // Finished before the cancel: its output, if fal gives it.
            counted("finished")
            return try? await output(of: request, call: call)
        }
        guard cancelled.status == 202 || cancelled.status == 200 else {
            counted(cancelled.status == 404 ? "let_go" : "unconfirmed")
            return nil
        }
        while ContinuousClock.now < call.deadline {
            guard let answer = try? await call.send(maxBytes: 1 << 20, { authorized(request.statusURL, method: .GET) }) else { break }
            let status = (try? JSONDecoder().decode(Status.self, from: answer.body))?.status
            if answer.status == 404 {
                counted("let_go")
                return nil
            }
            if status == "COMPLETED" {
                // Cancelled, or finished as the cancel came: a cancelled request has no output.
                if let output = try? await output(of: request, call: call) {
                    counted("finished")
                    return output
                }
                counted("let_go")
                return nil
            }
            try? await Task.sleep(for: .milliseconds(500))
        }
        counted("unconfirmed")
        return nil
    }

    /// The finished request's output: its JSON, then the file it names.
    func output(of request: ProviderRequest, call: ProviderCall) async throws -> ModelOutput {
        let answer = try await call.send(maxBytes: 1 << 20) { authorized(request.responseURL, method: .GET) }
        guard answer.status == 200 else { throw refusalOrFailure(answer, call: call) }
        guard let output = try? JSONDecoder().decode(Output.self, from: answer.body),
              let file = output.video ?? output.image ?? output.images?.first else {
            throw EffectError("fal's result names no video or image", retryable: false)
        }
        // The file's URL is fal's CDN (public, no key).
        let fetched = try await call.send { HTTPClientRequest(url: file.url) }
        guard fetched.status == 200 else {
            throw EffectError("fal's result file could not be fetched (\(fetched.status))", retryable: true)
        }
        return ModelOutput(bytes: fetched.body, contentType: file.content_type ?? fetched.headers.first(name: "Content-Type") ?? "application/octet-stream")
    }

    /// Asks fal to cancel the request (the user cancelled the job); best effort.
    func cancel(_ request: ProviderRequest) async {
        guard let url = request.cancelURL else { return }
        _ = try? await WorkerHTTP.execute(authorized(url, method: .PUT), timeout: .seconds(10))
    }

    func refusalOrFailure(_ answer: ProviderCall.Answer, call: ProviderCall) -> EffectError {
        if answer.status == 422, let detail = try? JSONDecoder().decode(Detail.self, from: answer.body),
           detail.detail?.contains(where: { $0.type == "content_policy_violation" }) == true {
            return call.refusal()
        }
        return call.failure(answer)
    }
}

/// A JSON value, for a model's input object.
enum JSONValue: Encodable {
    case string(String)
    case number(Double)

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        }
    }
}
