import AsyncHTTPClient
import Foundation
import NIOCore

/// What a model made: its bytes and their type.
struct ModelOutput: Sendable {
    var bytes: Data
    var contentType: String
}

/// Google's Gemini image models (`gemini-2.5-flash-image`, "Nano Banana"): one `generateContent`
/// call with the prompt as text and the photo as inline data; the edited image comes back as an
/// inline data part.
///
/// Shapes from the Gemini API reference (ai.google.dev/api/generate-content, "Image generation"
/// guide): `POST {base}/v1beta/models/{model}:generateContent` with `x-goog-api-key`; the body
/// `{"contents": [{"parts": [{"text"}, {"inline_data": {"mime_type", "data"}}]}],
/// "generationConfig": {"responseModalities": ["TEXT", "IMAGE"]}}`; the answer
/// `{"candidates": [{"content": {"parts": [{"text"} | {"inlineData": {"mimeType", "data"}}]},
/// "finishReason"}], "promptFeedback": {"blockReason"}}`. A blocked prompt has a `blockReason`
/// and no candidates; a refused image ends with a safety finish reason (`SAFETY`,
/// `IMAGE_SAFETY`, `PROHIBITED_CONTENT`, ...). Errors are `{"error": {"code", "message",
/// "status"}}` with 400, 403, 429 (`RESOURCE_EXHAUSTED`), 500 and 503.
struct GeminiAdapter: Sendable {
    let baseURL: String
    let key: String

    /// Finish reasons that mean the model declined.
    static let refusals: Set<String> = [
        "SAFETY", "IMAGE_SAFETY", "PROHIBITED_CONTENT", "IMAGE_PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "IMAGE_RECITATION",
    ]

    struct Ask: Encodable {
        struct Content: Encodable { var parts: [Part] }
        struct Part: Encodable {
            var text: String?
            var inline_data: Inline?
        }
        struct Inline: Encodable {
            var mime_type: String
            var data: String
        }
        struct Config: Encodable { var responseModalities: [String] }
        var contents: [Content]
        var generationConfig: Config
    }

    struct Answer: Decodable {
        struct Candidate: Decodable {
            struct Content: Decodable { var parts: [Part]? }
            struct Part: Decodable {
                var text: String?
                var inlineData: Inline?
                var inline_data: Inline?
            }
            struct Inline: Decodable {
                var mimeType: String?
                var mime_type: String?
                var data: String
            }
            var content: Content?
            var finishReason: String?
        }
        struct Feedback: Decodable { var blockReason: String? }
        var candidates: [Candidate]?
        var promptFeedback: Feedback?
    }

    /// JSON allows `/` unescaped, and the image's base64 is full of them: escaping each made the
    /// body bigger and slower to write.
    static let encoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .withoutEscapingSlashes
        return encoder
    }()

    func edit(_ image: Data, contentType: String, prompt: String, call: ProviderCall) async throws -> ModelOutput {
        let body = try Self.encoder.encode(Ask(
            contents: [.init(parts: [.init(text: prompt), .init(inline_data: .init(mime_type: contentType, data: image.base64EncodedString()))])],
            generationConfig: .init(responseModalities: ["TEXT", "IMAGE"])
        ))
        let model = call.model.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? call.model
        let answer = try await call.send {
            var request = HTTPClientRequest(url: "\(baseURL)/v1beta/models/\(model):generateContent")
            request.method = .POST
            request.headers.add(name: "x-goog-api-key", value: key)
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body))
            return request
        }
        guard answer.status == 200 else { throw call.failure(answer) }
        guard let decoded = try? JSONDecoder().decode(Answer.self, from: answer.body) else {
            throw EffectError("gemini answered 200 with a body that is not a generateContent response", retryable: true)
        }
        if decoded.promptFeedback?.blockReason != nil { throw call.refusal() }
        guard let candidate = decoded.candidates?.first else { throw call.refusal() }
        for part in candidate.content?.parts ?? [] {
            if let inline = part.inlineData ?? part.inline_data, let bytes = Data(base64Encoded: inline.data) {
                return ModelOutput(bytes: bytes, contentType: inline.mimeType ?? inline.mime_type ?? "image/png")
            }
        }
        if let reason = candidate.finishReason, Self.refusals.contains(reason) { throw call.refusal() }
        // Only text (the model sometimes answers in words): another attempt may draw an image.
        throw EffectError("gemini answered without an image (finish reason \(candidate.finishReason ?? "none"))", retryable: true)
    }
}

/// OpenAI's image edits (`gpt-image-1`): a multipart `POST {base}/v1/images/edits` with `image`
/// (the photo as a file), `prompt` and `model`, `Authorization: Bearer`; the answer is
/// `{"created", "data": [{"b64_json"}]}` (gpt-image-1 always answers base64).
///
/// Shapes from OpenAI's API reference ("Images: Create image edit"). Errors are
/// `{"error": {"message", "type", "param", "code"}}`; a prompt or image refused by the
/// moderation system is a 400 whose code is `moderation_blocked` (`content_policy_violation` in
/// older models). 429 carries `retry-after` / `retry-after-ms` when OpenAI names a wait.
struct OpenAIAdapter: Sendable {
    let baseURL: String
    let key: String

    static let refusalCodes: Set<String> = ["moderation_blocked", "content_policy_violation"]

    struct Answer: Decodable {
        struct Item: Decodable { var b64_json: String? }
        var data: [Item]?
    }

    struct ErrorBody: Decodable {
        struct Inner: Decodable {
            var code: String?
            var type: String?
        }
        var error: Inner?
    }

    func edit(_ image: Data, contentType: String, prompt: String, call: ProviderCall) async throws -> ModelOutput {
        let boundary = "photoedit-\(UUID().uuidString)"
        let fileExtension = ["image/png": "png", "image/webp": "webp"][contentType] ?? "jpg"
        var body = Data()
        func field(_ name: String, _ value: String) {
            body.append(Data("--\(boundary)\r\nContent-Disposition: form-data; name=\"\(name)\"\r\n\r\n\(value)\r\n".utf8))
        }
        field("model", call.model)
        field("prompt", prompt)
        body.append(Data("--\(boundary)\r\nContent-Disposition: form-data; name=\"image\"; filename=\"photo.\(fileExtension)\"\r\nContent-Type: \(contentType)\r\n\r\n".utf8))
        body.append(image)
        body.append(Data("\r\n--\(boundary)--\r\n".utf8))
        let payload = body
        let answer = try await call.send {
            var request = HTTPClientRequest(url: "\(baseURL)/v1/images/edits")
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(key)")
            request.headers.add(name: "Content-Type", value: "multipart/form-data; boundary=\(boundary)")
            request.body = .bytes(ByteBuffer(bytes: payload))
            return request
        }
        guard answer.status == 200 else {
            if answer.status == 400, let code = (try? JSONDecoder().decode(ErrorBody.self, from: answer.body))?.error?.code,
               Self.refusalCodes.contains(code) {
                throw call.refusal()
            }
            throw call.failure(answer)
        }
        guard let encoded = (try? JSONDecoder().decode(Answer.self, from: answer.body))?.data?.first?.b64_json,
              let bytes = Data(base64Encoded: encoded) else {
            throw EffectError("openai answered 200 without an image in data[0].b64_json", retryable: true)
        }
        return ModelOutput(bytes: bytes, contentType: "image/png")
    }
}
