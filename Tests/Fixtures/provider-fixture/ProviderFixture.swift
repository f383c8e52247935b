import AsyncHTTPClient
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Synchronization

// A local stand-in for the model providers the workers call, for tests, `make bench-models` and
// trying a model by hand with `make run`: Google's Gemini `generateContent`, OpenAI's image
// edits, and fal's queue API, each answering in the shapes the provider documents (the adapters
// in Services/jobs/Worker/Providers name the pages) and checking what it is sent the way the
// real API would: the path, the key's header, the body's shape. A request the real API would
// reject is answered with that provider's error and recorded in `/_fixture/stats` under
// `rejected`, which tests require to stay empty.
//
// The prompt steers it, so a test needs no control calls: `unsafe` is refused for safety;
// `ratelimit` is answered 429 three times (per prompt), then served, each 429 asking for a wait
// as its provider does (Gemini: `RetryInfo.retryDelay` of 2.5 s in the body and no header, and a
// request of that prompt sent sooner is recorded as rejected; OpenAI and fal: `Retry-After: 2`);
// `nocredit` is answered as an account out of money (OpenAI's 429 `insufficient_quota`, fal's
// 403 "User is locked. Reason: Exhausted balance."); for fal, `nowebhook` sends no webhook and
// `twicehook` sends it twice. fal's webhooks are signed as fal signs them (ED25519 over the request
// id, user id, timestamp and the body's SHA-256, in the `X-Fal-Webhook-*` headers), by a key the
// fixture makes at start and publishes at `GET /.well-known/jwks.json`, as fal's JWKS URL does.
// A wrong Gemini key gets Gemini's 400 `API_KEY_INVALID`. Images come back as the photo sent (a real image); videos as a real MP4 made by ffmpeg at start.
//
// FIXTURE_PORT (required), FIXTURE_HOST (127.0.0.1: the address it listens on and names in fal's
// status and result URLs; scripts/hosts.sh gives workers on other hosts one they reach), FIXTURE_IMAGE_MS (50: an image's time), FIXTURE_VIDEO_MS (5000: a
// queued generation's time), FIXTURE_GEMINI_KEY / FIXTURE_OPENAI_KEY / FIXTURE_FAL_KEY (the
// keys it accepts).

/// What the fixture saw: requests by route, the most in flight at once by provider, what it
/// rejected, and fal's queue.
struct Stats: Codable {
    var requests: [String: Int] = [:]
    var inFlight: [String: Int] = [:]
    var maxInFlight: [String: Int] = [:]
    var rejected: [String] = []
    var rateLimited: [String: Int] = [:]
    /// Answers that said the account is out of money.
    var billingRefusals = 0
    var submissions = 0
    var cancels = 0
    var webhooksSent = 0
    var webhookFailures = 0
    var falRequestsWaiting = 0
    /// Direct generations whose caller closed the connection before the answer.
    var abandoned = 0
    var maxFalRequestsWaiting = 0
}

struct FalRequest {
    var model: String
    var prompt: String
    var image: Data
    var imageType: String
    var readyAt: ContinuousClock.Instant
    var cancelled = false
}

final class State: Sendable {
    let stats = Mutex(Stats())
    let fal = Mutex<[String: FalRequest]>([:])
    /// When each rate-limited prompt may be sent again, by Gemini's `retryDelay`.
    let notBefore = Mutex<[String: ContinuousClock.Instant]>([:])

    func begin(_ provider: String, _ route: String) {
        stats.withLock {
            $0.requests[route, default: 0] += 1
            $0.inFlight[provider, default: 0] += 1
            $0.maxInFlight[provider] = max($0.maxInFlight[provider] ?? 0, $0.inFlight[provider]!)
        }
    }
    func end(_ provider: String) { stats.withLock { $0.inFlight[provider, default: 1] -= 1 } }
    func reject(_ reason: String) { stats.withLock { if $0.rejected.count < 100 { $0.rejected.append(reason) } } }

    /// Whether this prompt's request is to be answered 429 now (three times per prompt).
    func rateLimit(_ prompt: String) -> Bool {
        guard prompt.contains("ratelimit") else { return false }
        return stats.withLock { stats in
            let seen = stats.rateLimited[prompt, default: 0]
            guard seen < 3 else { return false }
            stats.rateLimited[prompt] = seen + 1
            return true
        }
    }
}

@main
struct ProviderFixture: Sendable {
    let host: String
    let port: Int
    let imageDelay: Duration
    let videoDelay: Duration
    let geminiKey: String
    let openAIKey: String
    let falKey: String
    let video: Data
    let state = State()
    /// The key fal's webhooks are signed with.
    let webhookKey = Curve25519.Signing.PrivateKey()
    var base: String { "http://\(host):\(port)" }

    static func main() async throws {
        let environment = ProcessInfo.processInfo.environment
        guard let port = environment["FIXTURE_PORT"].flatMap(Int.init) else {
            FileHandle.standardError.write(Data("FIXTURE_PORT is required\n".utf8))
            exit(2)
        }
        let fixture = ProviderFixture(
            host: environment["FIXTURE_HOST"] ?? "127.0.0.1",
            port: port,
            imageDelay: .milliseconds(Int(environment["FIXTURE_IMAGE_MS"] ?? "") ?? 50),
            videoDelay: .milliseconds(Int(environment["FIXTURE_VIDEO_MS"] ?? "") ?? 5000),
            geminiKey: environment["FIXTURE_GEMINI_KEY"] ?? "test-gemini-key",
            openAIKey: environment["FIXTURE_OPENAI_KEY"] ?? "test-openai-key",
            falKey: environment["FIXTURE_FAL_KEY"] ?? "test-fal-key",
            video: try makeVideo()
        )
        try await fixture.run()
    }

    /// A one-second MP4, made once.
    static func makeVideo() throws -> Data {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("fixture-\(UUID().uuidString).mp4")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=10", "-t", "1",
                             "-pix_fmt", "yuv420p", "-c:v", "libx264", file.path]
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CancellationError() }
        defer { try? FileManager.default.removeItem(at: file) }
        return try Data(contentsOf: file)
    }

    // MARK: Answers

    static func json(_ status: HTTPResponse.Status, _ value: Any, headers: HTTPFields = [:]) -> Response {
        let data = (try? JSONSerialization.data(withJSONObject: value)) ?? Data()
        var fields = headers
        fields[.contentType] = "application/json"
        return Response(status: status, headers: fields, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func sniff(_ data: Data) -> String? {
        let bytes = Array(data.prefix(12))
        if bytes.starts(with: [0xFF, 0xD8, 0xFF]) { return "image/jpeg" }
        if bytes.starts(with: [0x89, 0x50, 0x4E, 0x47]) { return "image/png" }
        if bytes.count >= 12, bytes.starts(with: Array("RIFF".utf8)), Array(bytes[8..<12]) == Array("WEBP".utf8) { return "image/webp" }
        return nil
    }

    /// Google's error envelope.
    static func googleError(_ code: Int, _ status: String, _ message: String, headers: HTTPFields = [:]) -> Response {
        json(.init(code: code), ["error": ["code": code, "message": message, "status": status]], headers: headers)
    }

    /// OpenAI's error envelope.
    static func openAIError(_ code: Int, _ message: String, type: String, errorCode: String?, headers: HTTPFields = [:]) -> Response {
        json(.init(code: code), ["error": ["message": message, "type": type, "param": NSNull(), "code": errorCode.map { $0 as Any } ?? NSNull()]], headers: headers)
    }

    /// fal's error body.
    static func falDetail(_ status: Int, _ message: String) -> Response { json(.init(code: status), ["detail": message]) }

    func falAuthorized(_ request: Request) -> Bool { request.headers[.authorization] == "Key \(falKey)" }

    /// The parts of a multipart/form-data body: name to (filename, content type, bytes).
    static func multipart(_ body: Data, boundary: String) -> [String: (filename: String?, type: String?, data: Data)] {
        var parts: [String: (filename: String?, type: String?, data: Data)] = [:]
        let delimiter = Data("--\(boundary)".utf8)
        var chunks: [Data] = []
        var rest = body[...]
        while let range = rest.range(of: delimiter) {
            chunks.append(Data(rest[rest.startIndex..<range.lowerBound]))
            rest = rest[range.upperBound...]
        }
        for chunk in chunks.dropFirst() {
            guard let split = chunk.range(of: Data("\r\n\r\n".utf8)) else { continue }
            let head = String(decoding: chunk[chunk.startIndex..<split.lowerBound], as: UTF8.self)
            var content = Data(chunk[split.upperBound...])
            if content.suffix(2) == Data("\r\n".utf8) { content.removeLast(2) }
            func attribute(_ name: String) -> String? {
                guard let range = head.range(of: " \(name)=\"") else { return nil }
                return String(head[range.upperBound...].prefix { $0 != "\"" })
            }
            let type = head.components(separatedBy: "\r\n").first { $0.lowercased().hasPrefix("content-type:") }
                .map { $0.dropFirst("content-type:".count).trimmingCharacters(in: .whitespaces) }
            if let name = attribute("name") { parts[name] = (attribute("filename"), type, content) }
        }
        return parts
    }

    /// Sends fal's webhook for a finished request (its documented body), once or twice.
    func sendWebhook(_ url: String, id: String, times: Int) async {
        let payload: [String: Any] = [
            "request_id": id, "gateway_request_id": id, "status": "OK",
            "payload": ["video": ["url": "\(base)/files/\(id).mp4", "content_type": "video/mp4"]],
        ]
        let body = (try? JSONSerialization.data(withJSONObject: payload)) ?? Data()
        for _ in 0..<times {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            // Each delivery signed anew, with its own timestamp.
            let userId = "fixture-user", timestamp = String(Int(Date().timeIntervalSince1970))
            let digest = SHA256.hash(data: body).map { String(format: "%02x", $0) }.joined()
            let message = Data([id, userId, timestamp, digest].joined(separator: "\n").utf8)
            let signature = (try? webhookKey.signature(for: message)).map { Data($0).map { String(format: "%02x", $0) }.joined() } ?? ""
            request.headers.add(name: "X-Fal-Webhook-Request-Id", value: id)
            request.headers.add(name: "X-Fal-Webhook-User-Id", value: userId)
            request.headers.add(name: "X-Fal-Webhook-Timestamp", value: timestamp)
            request.headers.add(name: "X-Fal-Webhook-Signature", value: signature)
            request.body = .bytes(ByteBuffer(bytes: body))
            let answer = try? await HTTPClient.shared.execute(request, timeout: .seconds(15))
            state.stats.withLock { if answer?.status == .ok { $0.webhooksSent += 1 } else { $0.webhookFailures += 1 } }
        }
    }

    /// Runs a synchronous generation until it answers or its caller closes the connection, as a
    /// provider does for a direct request (fal's "Handle request cancellations": for direct
    /// connections "cancellation also triggers automatically when the caller drops the HTTP ...
    /// connection"): a generation given up by its caller stops at once, counted in `abandoned`.
    func untilClosed(_ request: Request, _ generate: (Request) async throws -> Response) async throws -> Response {
        do {
            return try await request.body.consumeWithCancellationOnInboundClose { body in
                var request = request
                request.body = body
                return try await generate(request)
            }
        } catch is CancellationError {
            state.stats.withLock { $0.abandoned += 1 }
            return Response(status: .init(code: 499))
        }
    }

    // MARK: Routes

    func run() async throws {
        let router = Router()
        router.post("/v1beta/models/:call") { request, context in
            let call = try context.parameters.require("call")
            return try await untilClosed(request) { try await gemini($0, call: call) }
        }
        router.post("/v1/images/edits") { request, _ in try await untilClosed(request) { try await openAI($0) } }
        // fal's JWKS (its keys as fal publishes them: OKP, Ed25519, `x` in base64url).
        router.get("/.well-known/jwks.json") { _, _ in
            let x = webhookKey.publicKey.rawRepresentation.base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            let jwks = #"{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "\#(x)"}]}"#
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: jwks)))
        }
        router.get("/files/:name") { _, context in try file(try context.parameters.require("name")) }
        router.get("/_fixture/stats") { _, _ in
            // Generations in flight now: submitted, not cancelled, not yet done.
            let now = ContinuousClock.now
            let waiting = state.fal.withLock { $0.values.filter { !$0.cancelled && $0.readyAt > now }.count }
            var stats = state.stats.withLock { $0 }
            stats.falRequestsWaiting = waiting
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: try JSONEncoder().encode(stats))))
        }
        router.on("/**", method: .post) { request, _ in try await falSubmit(request) }
        router.on("/**", method: .get) { request, _ in falRead(request) }
        router.on("/**", method: .put) { request, _ in falCancel(request) }
        var logger = Logger(label: "provider-fixture")
        logger.logLevel = .warning
        let app = Application(router: router, configuration: .init(address: .hostname(host, port: port)), logger: logger)
        print("provider-fixture listening on \(port)")
        try await app.runService()
    }

    /// Gemini: `POST /v1beta/models/{model}:generateContent`.
    func gemini(_ request: Request, call: String) async throws -> Response {
        state.begin("gemini", "gemini.generateContent")
        defer { state.end("gemini") }
        guard call.hasSuffix(":generateContent"), call.hasPrefix("gemini-") else {
            state.reject("gemini: path \(call)")
            return Self.googleError(404, "NOT_FOUND", "models/\(call) is not found for API version v1beta")
        }
        guard let key = request.headers[HTTPField.Name("x-goog-api-key")!] else {
            state.reject("gemini: no x-goog-api-key")
            return Self.googleError(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.")
        }
        guard key == geminiKey else {
            // As Gemini answers a key it does not know: 400, not 401 or 403, with the reason in
            // an ErrorInfo detail.
            state.reject("gemini: wrong x-goog-api-key")
            let message = "API key not valid. Please pass a valid API key."
            return Self.json(.badRequest, ["error": [
                "code": 400, "status": "INVALID_ARGUMENT", "message": message,
                "details": [
                    ["@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com",
                     "metadata": ["service": "generativelanguage.googleapis.com"]],
                    ["@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": message],
                ],
            ]])
        }
        let body = try await request.body.collect(upTo: 100 << 20)
        guard let ask = try? JSONDecoder().decode(GeminiAsk.self, from: Data(buffer: body)), let parts = ask.contents.first?.parts else {
            state.reject("gemini: body is not {contents: [{parts}]}")
            return Self.googleError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        }
        let prompt = parts.compactMap(\.text).joined(separator: " ")
        let inline = parts.compactMap { $0.inline_data ?? $0.inlineData }.first
        guard !prompt.isEmpty, let inline, let mime = inline.mime_type ?? inline.mimeType, let encoded = inline.data,
              let data = Data(base64Encoded: encoded), Self.sniff(data) == mime else {
            state.reject("gemini: parts need a text and an inline_data image whose mime_type matches its bytes")
            return Self.googleError(400, "INVALID_ARGUMENT", "Unable to process input image.")
        }
        if let notBefore = state.notBefore.withLock({ $0[prompt] }), ContinuousClock.now < notBefore {
            state.reject("gemini: sent again before the RetryInfo.retryDelay it was given")
        }
        if state.rateLimit(prompt) {
            // As Gemini answers a rate limit: no Retry-After header; the wait is a RetryInfo
            // detail in the body, beside the QuotaFailure that names the limit.
            state.notBefore.withLock { $0[prompt] = .now.advanced(by: .milliseconds(2500)) }
            return Self.json(.tooManyRequests, ["error": [
                "code": 429, "status": "RESOURCE_EXHAUSTED",
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "details": [
                    ["@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [[
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_paid_tier_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel", "quotaValue": "10",
                    ]]],
                    ["@type": "type.googleapis.com/google.rpc.Help", "links": [["description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"]]],
                    ["@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.5s"],
                ],
            ]])
        }
        try await Task.sleep(for: imageDelay)
        if prompt.contains("unsafe") {
            return Self.json(.ok, ["promptFeedback": ["blockReason": "SAFETY"], "usageMetadata": ["promptTokenCount": 10]])
        }
        // The image sent comes back: its base64 (checked above, and which needs no escaping in
        // JSON) is put into the answer as it came, not decoded and encoded again.
        let model = String(call.dropLast(":generateContent".count).filter { $0.isLetter || $0.isNumber || "-._".contains($0) })
        let answer = #"{"candidates":[{"content":{"role":"model","parts":[{"text":"Here is your edit."},{"inlineData":{"mimeType":"\#(mime)","data":""#
            + encoded + #""}}]},"finishReason":"STOP","index":0}],"modelVersion":"\#(model)"}"#
        return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: answer)))
    }

    /// The fields of a Gemini request that the fixture checks; it ignores the others.
    struct GeminiAsk: Decodable {
        struct Content: Decodable { var parts: [Part] }
        struct Part: Decodable {
            var text: String?
            var inline_data: Inline?
            var inlineData: Inline?
        }
        struct Inline: Decodable {
            var mime_type: String?
            var mimeType: String?
            var data: String?
        }
        var contents: [Content]
    }

    /// OpenAI: `POST /v1/images/edits`, multipart.
    func openAI(_ request: Request) async throws -> Response {
        state.begin("openai", "openai.images.edits")
        defer { state.end("openai") }
        guard request.headers[.authorization] == "Bearer \(openAIKey)" else {
            state.reject("openai: missing or wrong bearer key")
            return Self.openAIError(401, "Incorrect API key provided.", type: "invalid_request_error", errorCode: "invalid_api_key")
        }
        guard let contentType = request.headers[.contentType], contentType.hasPrefix("multipart/form-data"),
              let boundary = contentType.components(separatedBy: "boundary=").last, !boundary.isEmpty else {
            state.reject("openai: not multipart/form-data")
            return Self.openAIError(400, "Invalid Content-Type header, expected multipart/form-data.", type: "invalid_request_error", errorCode: nil)
        }
        let body = Data(buffer: try await request.body.collect(upTo: 100 << 20))
        let parts = Self.multipart(body, boundary: boundary)
        guard let model = parts["model"].map({ String(decoding: $0.data, as: UTF8.self) }), model.hasPrefix("gpt-image") || model.hasPrefix("dall-e"),
              let prompt = parts["prompt"].map({ String(decoding: $0.data, as: UTF8.self) }), !prompt.isEmpty,
              let image = parts["image"], image.filename != nil, let type = Self.sniff(image.data), image.type == type else {
            state.reject("openai: multipart needs model, prompt and an image file whose type matches its bytes")
            return Self.openAIError(400, "Invalid request: model, prompt and image are required.", type: "invalid_request_error", errorCode: nil)
        }
        if prompt.contains("nocredit") {
            state.stats.withLock { $0.billingRefusals += 1 }
            return Self.openAIError(429, "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
                                    type: "insufficient_quota", errorCode: "insufficient_quota")
        }
        if state.rateLimit(prompt) {
            return Self.openAIError(429, "Rate limit reached for images per minute.", type: "requests", errorCode: "rate_limit_exceeded", headers: [.retryAfter: "2"])
        }
        try await Task.sleep(for: imageDelay)
        if prompt.contains("unsafe") {
            return Self.openAIError(400, "Your request was rejected by the safety system.", type: "image_generation_user_error", errorCode: "moderation_blocked")
        }
        return Self.json(.ok, ["created": Int(Date().timeIntervalSince1970), "data": [["b64_json": image.data.base64EncodedString()]]])
    }

    /// The files fal's results name (its CDN): the video, or an image model's image.
    func file(_ name: String) throws -> Response {
        if name.hasSuffix(".mp4") {
            return Response(status: .ok, headers: [.contentType: "video/mp4"], body: .init(byteBuffer: ByteBuffer(bytes: video)))
        }
        let id = String(name.split(separator: ".").first ?? "")
        guard let request = state.fal.withLock({ $0[id] }) else { return Response(status: .notFound) }
        return Response(status: .ok, headers: [.contentType: request.imageType], body: .init(byteBuffer: ByteBuffer(bytes: request.image)))
    }

    /// fal: `POST /{model_id}[?fal_webhook=]` submits to the queue.
    func falSubmit(_ request: Request) async throws -> Response {
        state.begin("fal", "fal.submit")
        defer { state.end("fal") }
        let model = String(request.uri.path.dropFirst())
        guard model.hasPrefix("fal-ai/"), !model.contains("/requests/") else {
            state.reject("fal: submit path \(model)")
            return Self.falDetail(404, "Application not found")
        }
        guard falAuthorized(request) else {
            state.reject("fal: missing or wrong Authorization: Key")
            return Self.falDetail(401, "Unauthorized")
        }
        let body = Data(buffer: try await request.body.collect(upTo: 100 << 20))
        guard let input = try? JSONSerialization.jsonObject(with: body) as? [String: Any], let prompt = input["prompt"] as? String,
              let imageURL = input["image_url"] as? String, let comma = imageURL.firstIndex(of: ","),
              let image = Data(base64Encoded: String(imageURL[imageURL.index(after: comma)...])),
              let type = Self.sniff(image), imageURL.hasPrefix("data:\(type);base64,") else {
            state.reject("fal: input needs prompt and image_url (a data URI of an image)")
            return Self.json(.unprocessableContent, ["detail": [["loc": ["body", "image_url"], "msg": "field required", "type": "value_error.missing"]]])
        }
        if prompt.contains("nocredit") {
            state.stats.withLock { $0.billingRefusals += 1 }
            return Self.falDetail(403, "User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing.")
        }
        if state.rateLimit(prompt) {
            return Self.json(.tooManyRequests, ["detail": "Too many requests"], headers: [.retryAfter: "2"])
        }
        let id = UUID().uuidString.lowercased()
        let waiting = state.fal.withLock { requests -> Int in
            requests[id] = FalRequest(model: model, prompt: prompt, image: image, imageType: type, readyAt: .now.advanced(by: videoDelay))
            return requests.values.filter { !$0.cancelled && $0.readyAt > .now }.count
        }
        state.stats.withLock {
            $0.submissions += 1
            $0.falRequestsWaiting = waiting
            $0.maxFalRequestsWaiting = max($0.maxFalRequestsWaiting, waiting)
        }
        if let webhook = request.uri.queryParameters["fal_webhook"].map(String.init), !prompt.contains("nowebhook") {
            let times = prompt.contains("twicehook") ? 2 : 1
            Task {
                try? await Task.sleep(for: videoDelay)
                await sendWebhook(webhook, id: id, times: times)
            }
        }
        let root = "\(base)/\(model)/requests/\(id)"
        return Self.json(.ok, ["request_id": id, "response_url": root, "status_url": root + "/status", "cancel_url": root + "/cancel", "queue_position": 0])
    }

    /// fal: `GET /{model_id}/requests/{id}/status` and `GET /{model_id}/requests/{id}` (the result).
    func falRead(_ request: Request) -> Response {
        let path = request.uri.path
        guard let range = path.range(of: "/requests/") else { return Self.falDetail(404, "Not found") }
        let model = String(path[path.index(after: path.startIndex)..<range.lowerBound])
        let tail = path[range.upperBound...].split(separator: "/")
        guard let idPart = tail.first else { return Self.falDetail(404, "Not found") }
        let id = String(idPart)
        let isStatus = tail.count == 2 && tail[1] == "status"
        state.begin("fal-poll", isStatus ? "fal.status" : "fal.result")
        defer { state.end("fal-poll") }
        guard falAuthorized(request) else {
            state.reject("fal: status or result without Authorization: Key")
            return Self.falDetail(401, "Unauthorized")
        }
        guard let job = state.fal.withLock({ $0[id] }), job.model == model else { return Self.falDetail(404, "Request not found") }
        // A cancelled request ends at once, without output (fal: one still queued is never run,
        // a running one is told to stop).
        let done = job.readyAt <= .now || job.cancelled
        if isStatus {
            return Self.json(.ok, ["status": done ? "COMPLETED" : "IN_PROGRESS", "queue_position": 0, "response_url": "\(base)/\(model)/requests/\(id)"])
        }
        guard done else { return Self.falDetail(400, "Request is still in progress") }
        if job.cancelled { return Self.falDetail(400, "Request was cancelled") }
        if job.prompt.contains("unsafe") {
            return Self.json(.unprocessableContent, ["detail": [[
                "loc": ["body", "prompt"], "type": "content_policy_violation",
                "msg": "The content could not be processed because it contained material flagged by a content checker.",
            ]]])
        }
        if model.contains("video") || model.contains("veo") {
            return Self.json(.ok, ["video": ["url": "\(base)/files/\(id).mp4", "content_type": "video/mp4", "file_name": "output.mp4"]])
        }
        return Self.json(.ok, ["images": [["url": "\(base)/files/\(id).img", "content_type": job.imageType]]])
    }

    /// fal: `PUT /{model_id}/requests/{id}/cancel`.
    func falCancel(_ request: Request) -> Response {
        let path = request.uri.path
        guard path.hasSuffix("/cancel"), let range = path.range(of: "/requests/") else { return Self.falDetail(404, "Not found") }
        guard falAuthorized(request) else {
            state.reject("fal: cancel without Authorization: Key")
            return Self.falDetail(401, "Unauthorized")
        }
        let id = String(path[range.upperBound...].split(separator: "/").first ?? "")
        enum Found { case none, done, cancelled }
        let found = state.fal.withLock { requests -> Found in
            guard let request = requests[id] else { return .none }
            guard request.readyAt > .now, !request.cancelled else { return .done }
            requests[id]?.cancelled = true
            return .cancelled
        }
        guard found != .none else { return Self.falDetail(404, "Request not found") }
        guard found == .cancelled else { return Self.json(.badRequest, ["status": "ALREADY_COMPLETED"]) }
        state.stats.withLock { $0.cancels += 1 }
        return Self.json(.accepted, ["status": "CANCELLATION_REQUESTED"])
    }
}
