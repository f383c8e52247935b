import Blobs
import Foundation
import ImageOps
import JobsCore
import Messages

/// Runs the provider models: an image model wholly in memory (the input fetched, sent, the answer
/// checked, converted to JPEG only when it is not one, thumbnailed and stored, with no file: a
/// model job's work is waiting and moving bytes, and scratch files cost more than the image
/// work); a video model through the scratch folder, which ffmpeg reads.
extension EffectRunner {
    static let providers = EffectCatalog.providers

    /// An image model's attempt, from its URLs to its stored outputs.
    func runImageModel(_ job: JobAssignment, transfer: @Sendable () async throws -> JobTransfer, hooks: GenerationHooks,
                       progress: @escaping @Sendable (Double) -> Void) async throws -> JobOutput {
        let urls = try await transfer()
        let input = try await fetch(urls.inputURL, version: job.imageETag)
        _ = try await checkSize(input, what: "the input image")
        progress(0.1)
        try await hooks.place()
        let made = try await generate(job, input: input, hooks: hooks, progress: progress)
        hooks.answered()
        guard let type = ImageSniffer.contentType(of: Array(made.bytes.prefix(16))) else {
            throw EffectError("the model did not answer with an image", retryable: false)
        }
        // The model's answer is input like any other: its size is checked before it is decoded.
        _ = try await checkSize(made.bytes, what: "the model's image")
        let result = type == "image/jpeg" ? made.bytes : try await jpeg(made.bytes)
        progress(0.6)
        // The result is stored while its thumbnail is made and stored: the two writes overlap.
        let outputs = try await transfer()
        async let resultStored: Void = store(bytes: result, with: outputs.result)
        do {
            let thumbnail = try await thumbnail(of: result)
            progress(0.9)
            try await store(bytes: thumbnail, with: outputs.thumbnail)
        } catch {
            try? await resultStored
            throw error
        }
        try await resultStored
        return JobOutput(resultKey: outputs.result.key, thumbnailKey: outputs.thumbnail.key)
    }

    /// A video model's attempt: the MP4 it made, written to `output` (its thumbnail is the
    /// caller's, from the file).
    func videoModel(_ job: JobAssignment, input: URL, to output: URL, hooks: GenerationHooks,
                    progress: @escaping @Sendable (Double) -> Void) async throws {
        let bytes = try await blocking { try Data(contentsOf: input) }
        let made = try await generate(job, input: bytes, hooks: hooks, progress: progress)
        let head = Array(made.bytes.prefix(12))
        guard head.count == 12, Array(head[4..<8]) == Array("ftyp".utf8), ImageSniffer.contentType(of: head) == nil else {
            throw EffectError("the model's answer is not an MP4 video", retryable: false)
        }
        try await blocking { try made.bytes.write(to: output) }
    }

    /// Asks the effect's provider for its output on `input`.
    func generate(_ job: JobAssignment, input: Data, hooks: GenerationHooks, progress: @escaping @Sendable (Double) -> Void) async throws -> ModelOutput {
        let effect = job.effect
        let model = effect.model ?? ""
        let timeout = effect.timeoutSeconds.map { Duration.seconds($0) } ?? (effect.kind == .video ? providers.videoTimeout : providers.imageTimeout)
        let prompt = job.prompt.flatMap { $0.isEmpty ? nil : $0 } ?? effect.title
        let contentType = Self.imageType(of: input)
        func key(_ value: String?, _ name: String) throws -> String {
            guard let value else { throw EffectError("\(name) is not set on this worker", retryable: false) }
            return value
        }
        switch effect.processor {
        case "gemini":
            let adapter = GeminiAdapter(baseURL: effect.endpoint ?? providers.geminiBaseURL, key: try key(providers.geminiKey, "GEMINI_API_KEY"))
            return try await adapter.edit(input, contentType: contentType, prompt: prompt, call: ProviderCall(provider: "gemini", model: model, timeout: timeout))
        case "openai":
            let adapter = OpenAIAdapter(baseURL: effect.endpoint ?? providers.openAIBaseURL, key: try key(providers.openAIKey, "OPENAI_API_KEY"))
            return try await adapter.edit(input, contentType: contentType, prompt: prompt, call: ProviderCall(provider: "openai", model: model, timeout: timeout))
        default:
            let adapter = FalAdapter(queueURL: effect.endpoint ?? providers.falQueueURL, key: try key(providers.falKey, "FAL_KEY"))
            // An earlier attempt's submission is waited on, not submitted again.
            let request: ProviderRequest
            if let submitted = job.submission {
                request = submitted
            } else {
                request = try await adapter.submit(
                    input, contentType: contentType, prompt: prompt, parameters: job.parameters, webhook: job.callbackURL,
                    call: ProviderCall(provider: "fal", model: model, timeout: timeout)
                )
            }
            hooks.submitted(request)
            // The timeout counts from the submission, whichever worker submitted it.
            let elapsed = Duration.milliseconds(Int64(max(0, Date().timeIntervalSince(request.submittedAt)) * 1000))
            let call = ProviderCall(provider: "fal", model: model, timeout: timeout, from: ContinuousClock.now.advanced(by: .zero - elapsed))
            let interval = providers.pollInterval
            do {
                return try await adapter.result(of: request, call: call, progress: progress, wait: { try await hooks.wait(interval) })
            } catch {
                // The user cancelled: tell fal too (outside this cancelled task, awaited). A
                // worker handing the generation over as it stops leaves it running.
                if Task.isCancelled, !hooks.handedOff() { await Task.detached { await adapter.cancel(request) }.value }
                throw error
            }
        }
    }

    /// The type of an input image from its bytes (uploads are checked, so it is one of these).
    static func imageType(of bytes: Data) -> String {
        ImageSniffer.contentType(of: Array(bytes.prefix(16))) ?? "image/jpeg"
    }

    /// The size of an image in memory, refused over the pixel limit: read from its header as the
    /// gateway reads uploads' (no libvips pipeline, which costs more than the rest of the check),
    /// through libvips where the header is not in the first 256 KiB or not one of those types.
    func checkSize(_ bytes: Data, what: String) async throws -> ImageSize {
        let size: ImageSize
        if let type = ImageSniffer.contentType(of: Array(bytes.prefix(16))), let read = ImageSize.read(Array(bytes.prefix(256 << 10)), contentType: type) {
            size = read
        } else {
            size = try await blocking {
                var width: Int32 = 0, height: Int32 = 0
                var error = [CChar](repeating: 0, count: 512)
                let rc = bytes.withUnsafeBytes { imageops_probe_buffer($0.baseAddress, $0.count, &width, &height, &error, error.count) }
                guard rc == 0 else { throw EffectError("\(what) cannot be read: \(Self.text(error))", retryable: false) }
                return ImageSize(width: Int(width), height: Int(height))
            }
        }
        guard size.pixels <= maxPixels else {
            throw EffectError("\(what) is \(size), over the limit of \(maxPixels) pixels", retryable: false)
        }
        return size
    }

    /// `bytes` (an image of another type) as JPEG.
    func jpeg(_ bytes: Data) async throws -> Data {
        try await blocking {
            var error = [CChar](repeating: 0, count: 512)
            var out: UnsafeMutableRawPointer?
            var length = 0
            let rc = bytes.withUnsafeBytes { imageops_jpeg_buffer($0.baseAddress, $0.count, &out, &length, &error, error.count) }
            defer { imageops_free(out) }
            guard rc == 0, let out else { throw EffectError("the model's image could not be converted to JPEG: \(Self.text(error))", retryable: false) }
            return Data(bytes: out, count: length)
        }
    }

    /// The 200x200 centre-cropped JPEG thumbnail of an image in memory.
    func thumbnail(of bytes: Data) async throws -> Data {
        try await blocking {
            var error = [CChar](repeating: 0, count: 512)
            var out: UnsafeMutableRawPointer?
            var length = 0
            let rc = bytes.withUnsafeBytes { imageops_thumbnail_buffer($0.baseAddress, $0.count, 200, &out, &length, &error, error.count) }
            defer { imageops_free(out) }
            guard rc == 0, let out else { throw EffectError("thumbnail failed: \(Self.text(error))", retryable: false) }
            return Data(bytes: out, count: length)
        }
    }
}
