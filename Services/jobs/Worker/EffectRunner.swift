import AsyncHTTPClient
import Blobs
import Foundation
import ImageOps
import Messages
import NIOCore

/// A job's failure as the worker reports it.
public struct EffectError: Error, CustomStringConvertible {
    public var description: String
    public var retryable: Bool
    public init(_ description: String, retryable: Bool) {
        self.description = description
        self.retryable = retryable
    }
}

/// Runs an effect on a job's input and writes the result and a 200x200 JPEG thumbnail, through
/// the presigned URLs of the job's `JobTransfer`: the input is fetched over HTTP into a scratch
/// folder of the worker's own, and the outputs are `PUT` where the URLs say. So a worker needs
/// no shared disk and no store credentials, with the S3 store (the bucket's URLs) and with the
/// folder store (the gateway's signed routes) alike.
public struct EffectRunner: Sendable {
    /// Where inputs and outputs are kept while a job runs (removed after each attempt).
    let scratch: URL
    let maxPixels: Int
    /// The largest input fetched (`UPLOAD_MAX_BYTES` is checked before a job exists; this bounds
    /// what a worker holds whatever the store says).
    let maxInputBytes: Int
    /// The model providers' keys, base URLs and timeouts.
    let providers: ProviderSettings

    /// What the app shows when a model refuses an edit for safety.
    public static let refusalMessage = "The model declined this edit."

    public init(scratch: URL, maxPixels: Int = 50_000_000, maxInputBytes: Int = 64 << 20, providers: ProviderSettings = ProviderSettings()) {
        self.scratch = scratch
        self.maxPixels = maxPixels
        self.maxInputBytes = maxInputBytes
        self.providers = providers
        // libvips must be started before any use, and only once (a probe while another thread
        // was still in VIPS_INIT found no loader type and crashed the test process): a runner
        // cannot exist without it. After the first call this is a lock taken and given back.
        Self.startImageLibrary()
    }

    /// How a long generation talks to its worker: `submitted` once the provider has the request
    /// (the worker records it with the jobs service and frees the job's slot), `wait` between two
    /// polls (returning early when the provider's webhook came).
    public struct GenerationHooks: Sendable {
        public var submitted: @Sendable (ProviderRequest) -> Void
        public var wait: @Sendable (Duration) async throws -> Void
        /// Whether a cancellation is the worker stopping and handing the generation over (the
        /// provider's request goes on) rather than the user's cancel (it is cancelled there too).
        public var handedOff: @Sendable () -> Bool
        /// An image model (a provider's, or the operator's `remote` endpoint) answered: what is
        /// left of the job (checking the answer, its thumbnail, the two writes) calls no model,
        /// so the job's place goes to the next one now.
        public var answered: @Sendable () -> Void
        /// Waits for one of the worker's places, once the job's input is fetched and checked:
        /// a prefetched job downloads its input while it waits, and its place is spent on the
        /// work. Throws if the job is cancelled or given back meanwhile.
        public var place: @Sendable () async throws -> Void
        public init(submitted: @escaping @Sendable (ProviderRequest) -> Void, wait: @escaping @Sendable (Duration) async throws -> Void,
                    handedOff: @escaping @Sendable () -> Bool = { false }, answered: @escaping @Sendable () -> Void = {},
                    place: @escaping @Sendable () async throws -> Void = {}) {
            self.submitted = submitted
            self.wait = wait
            self.handedOff = handedOff
            self.answered = answered
            self.place = place
        }
        /// No one to tell; polls at the interval.
        public static let none = GenerationHooks(submitted: { _ in }, wait: { try await Task.sleep(for: $0) })
    }

    /// Starts libvips once per process.
    public static func startImageLibrary() {
        _ = imageops_start(CommandLine.arguments.first ?? "worker", 1)
    }

    /// Runs `job`. `transfer` gives its URLs, fresh (asked again if they expire before they are used).
    public func run(_ job: JobAssignment, transfer: @Sendable () async throws -> JobTransfer, hooks: GenerationHooks = .none,
                    progress: @escaping @Sendable (Double) -> Void) async throws -> JobOutput {
        if job.effect.processor == "noop" {
            // For benchmarks of the queue itself, configured through JOBS_EFFECTS only (never in
            // the catalogue): no file is read or written; the keys name nothing.
            try await hooks.place()
            return JobOutput(resultKey: "noop/\(job.attempt.jobId)", thumbnailKey: "noop/\(job.attempt.jobId)")
        }
        if job.effect.kind == .image, Self.providers.contains(job.effect.processor) {
            // A model's image needs no file: fetched, sent, checked and stored from memory.
            return try await runImageModel(job, transfer: transfer, hooks: hooks, progress: progress)
        }
        let folder = scratch.appendingPathComponent("\(job.attempt.jobId)-\(job.attempt.attempt)-\(UUID().uuidString.prefix(8))")
        try await blocking { try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true) }
        // Whatever happens, nothing of the attempt outlives it.
        do {
            let output = try await run(job, in: folder, transfer: transfer, hooks: hooks, progress: progress)
            _ = try? await blocking { try FileManager.default.removeItem(at: folder) }
            return output
        } catch {
            _ = try? await blocking { try FileManager.default.removeItem(at: folder) }
            throw error
        }
    }

    /// The attempt's work, its files in `folder`.
    func run(_ job: JobAssignment, in folder: URL, transfer: @Sendable () async throws -> JobTransfer, hooks: GenerationHooks,
             progress: @escaping @Sendable (Double) -> Void) async throws -> JobOutput {
        let urls = try await transfer()
        let inputExtension = job.imageKey.split(separator: ".").last.map { $0.lowercased() } ?? "jpg"
        let input = folder.appendingPathComponent("input.\(inputExtension)")
        try await fetch(urls.inputURL, version: job.imageETag, to: input)
        let resultKey = urls.result.key
        let result = folder.appendingPathComponent("result.\(resultKey.split(separator: ".").last.map(String.init) ?? "jpg")")
        let thumbnail = folder.appendingPathComponent("thumbnail.jpg")
        let size = try await checkSize(input)
        progress(0.1)
        try await hooks.place()
        switch job.effect.processor {
        case "copy":
            try await blocking { try FileManager.default.copyItem(at: input, to: result) }
        case "remote":
            try await remote(job, imageURL: urls.inputURL, to: result)
            // The operator's endpoint answered: as with a provider's image model, the rest of
            // the job needs no slot.
            hooks.answered()
        case "gemini", "openai", "fal":
            try await videoModel(job, input: input, to: result, hooks: hooks, progress: progress)
        case _ where job.effect.id == "auto-enhance":
            let scale = fittingScale(job.parameters["upscale"] ?? 1, of: size)
            try await enhance(input: input, output: result, fidelity: job.parameters["fidelity"] ?? 1, scale: scale)
        default:
            var amount = job.parameters["sigma"] ?? job.parameters["factor"] ?? 0
            if job.effect.id == "upscale" { amount = fittingScale(amount, of: size) }
            try await vips(input: input, output: result, effect: job.effect.id, amount: amount)
        }
        progress(0.6)
        if job.effect.kind == .video {
            try await VideoFrames.thumbnail(of: result, to: thumbnail, size: 200)
        } else {
            try await thumbnailOf(result, to: thumbnail)
        }
        progress(0.9)
        // The URLs again: the edit may have outlived them.
        let outputs = try await transfer()
        try await store(result, with: outputs.result)
        try await store(thumbnail, with: outputs.thumbnail)
        return JobOutput(resultKey: outputs.result.key, thumbnailKey: outputs.thumbnail.key)
    }

    /// Fetches the input at `url` into `file` (at most `maxInputBytes`), as `version` when one is
    /// given (`JobAssignment.imageETag`: `If-Match`). A missing or replaced input fails for good;
    /// an unreachable store, 5xx or an expired URL is retryable.
    func fetch(_ url: String, version: String?, to file: URL) async throws {
        let bytes = try await fetch(url, version: version)
        try await blocking { try bytes.write(to: file) }
    }

    /// Fetches the input at `url` into memory (at most `maxInputBytes`), failing as
    /// `fetch(_:version:to:)` does.
    func fetch(_ url: String, version: String?) async throws -> Data {
        var request = HTTPClientRequest(url: url)
        if let version { request.headers.add(name: "If-Match", value: version) }
        let response: HTTPClientResponse
        do {
            response = try await WorkerHTTP.execute(request, timeout: .seconds(60))
        } catch {
            throw EffectError("the input image could not be fetched: \(Self.describe(error))", retryable: true)
        }
        let status = Int(response.status.code)
        guard status == 200 else {
            if status == 404 { throw EffectError("the input image is missing", retryable: false) }
            if status == 412 { throw EffectError(Self.inputReplaced, retryable: false) }
            throw EffectError("the input image could not be fetched: the store answered \(status)", retryable: status >= 500 || status == 403 || status == 429)
        }
        let body: ByteBuffer
        do {
            body = try await response.body.collect(upTo: maxInputBytes)
        } catch {
            throw EffectError("the input image is over \(maxInputBytes) bytes or was cut short", retryable: false)
        }
        return Data(body.readableBytesView)
    }

    /// The error of a job whose input was replaced after the job was created (a client that
    /// uploaded without `If-None-Match` and PUT again to the same URL): it is not the image
    /// that was checked and paid for, so the job fails for good, and gives its credits back.
    static let inputReplaced = "the input image was replaced after the job was created; upload it again and start a new edit"

    /// Writes `file` with the presigned `write`. A full store (507) says so in words the
    /// worker's wait for space knows; other failures are retryable.
    func store(_ file: URL, with write: PresignedWrite) async throws {
        try await store(bytes: try await blocking { try Data(contentsOf: file) }, with: write)
    }

    /// Writes `bytes` with the presigned `write`, as `store(_:with:)` does.
    func store(bytes: Data, with write: PresignedWrite) async throws {
        var request = HTTPClientRequest(url: write.url)
        request.method = .PUT
        for (name, value) in write.headers { request.headers.add(name: name, value: value) }
        request.body = .bytes(ByteBuffer(bytes: bytes))
        let response: HTTPClientResponse
        do {
            response = try await WorkerHTTP.execute(request, timeout: .seconds(60))
        } catch {
            throw EffectError("the output could not be stored: \(Self.describe(error))", retryable: true)
        }
        let status = Int(response.status.code)
        _ = try? await response.body.collect(upTo: 64 << 10)
        guard (200..<300).contains(status) else {
            if status == 507 { throw EffectError("the output could not be stored: the store is full (No space left on device)", retryable: true) }
            throw EffectError("the output could not be stored: the store answered \(status)", retryable: true)
        }
    }

    static func describe(_ error: any Error) -> String {
        (error as? HTTPClientError).map(\.shortDescription) ?? String(describing: type(of: error))
    }

    /// `scale`, or less so that the output stays within the pixel limit (an upscale never makes
    /// an image bigger than the limit an upload may have).
    func fittingScale(_ scale: Double, of size: ImageSize) -> Double {
        let pixels = Double(size.width) * Double(size.height)
        guard pixels > 0, pixels * scale * scale > Double(maxPixels) else { return scale }
        return max(1, (Double(maxPixels) / pixels).squareRoot())
    }

    /// Refuses an input over the pixel limit from its header alone (the gateway checks uploads;
    /// this guards files that reached the store another way); returns its size.
    func checkSize(_ input: URL) async throws -> ImageSize {
        let size = try await blocking {
            var width: Int32 = 0, height: Int32 = 0
            var error = [CChar](repeating: 0, count: 512)
            guard imageops_probe(input.path, &width, &height, &error, error.count) == 0 else {
                throw EffectError("the input image cannot be read: \(Self.text(error))", retryable: false)
            }
            return ImageSize(width: Int(width), height: Int(height))
        }
        guard size.pixels <= maxPixels else {
            throw EffectError("the input image is \(size), over the limit of \(maxPixels) pixels", retryable: false)
        }
        return size
    }

    private func enhance(input: URL, output: URL, fidelity: Double, scale: Double) async throws {
        try await blocking {
            var error = [CChar](repeating: 0, count: 512)
            guard imageops_enhance(input.path, output.path, fidelity, scale, &error, error.count) == 0 else {
                throw EffectError("auto-enhance failed: \(Self.text(error))", retryable: false)
            }
        }
    }

    func vips(input: URL, output: URL, effect: String, amount: Double) async throws {
        try await blocking {
            var error = [CChar](repeating: 0, count: 512)
            let rc = imageops_apply(input.path, output.path, effect, amount, &error, error.count)
            guard rc == 0 else { throw EffectError("\(effect) failed: \(Self.text(error))", retryable: false) }
        }
    }

    private func thumbnailOf(_ image: URL, to output: URL) async throws {
        try await blocking {
            var error = [CChar](repeating: 0, count: 512)
            guard imageops_thumbnail(image.path, output.path, 200, &error, error.count) == 0 else {
                throw EffectError("thumbnail failed: \(Self.text(error))", retryable: false)
            }
        }
    }

    /// Asks a remote inference endpoint: JSON in (a signed URL of the image, effect, parameters,
    /// prompt); an image, or JSON `{imageUrl}`, out.
    private func remote(_ job: JobAssignment, imageURL: String, to output: URL) async throws {
        guard let endpoint = job.effect.endpoint.flatMap(URL.init(string:)) else {
            throw EffectError("effect \(job.effect.id) has no endpoint", retryable: false)
        }
        struct Ask: Encodable {
            var imageUrl: String
            var effect: String
            var parameters: [String: Double]
            var prompt: String?
        }
        struct Answer: Decodable { var imageUrl: String }
        var request = HTTPClientRequest(url: endpoint.absoluteString)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(bytes: try JSONEncoder().encode(Ask(
            imageUrl: imageURL,
            effect: job.effect.id, parameters: job.parameters, prompt: job.prompt
        ))))
        let (body, contentType) = try await fetch(request)
        var bytes = body
        if contentType.hasPrefix("application/json") {
            guard let answer = try? JSONDecoder().decode(Answer.self, from: body), URL(string: answer.imageUrl) != nil else {
                throw EffectError("the endpoint answered JSON without an imageUrl", retryable: false)
            }
            (bytes, _) = try await fetch(HTTPClientRequest(url: answer.imageUrl))
        }
        guard ImageSniffer.contentType(of: Array(bytes.prefix(16))) != nil else {
            throw EffectError("the endpoint did not answer with an image", retryable: false)
        }
        let answer = bytes
        try await blocking { try answer.write(to: output) }
    }

    /// Sends `request` (AsyncHTTPClient, two minutes at most); the body (64 MiB at most) and its
    /// content type. Transport errors, 5xx and 429 are retryable; other statuses are not.
    private func fetch(_ request: HTTPClientRequest) async throws -> (Data, String) {
        let response: HTTPClientResponse
        do {
            response = try await WorkerHTTP.execute(request, timeout: .seconds(120))
        } catch {
            throw EffectError("the endpoint could not be reached: \(error)", retryable: true)
        }
        let status = Int(response.status.code)
        guard (200..<300).contains(status) else {
            throw EffectError("the endpoint answered \(status)", retryable: status >= 500 || status == 429)
        }
        let body: ByteBuffer
        do {
            body = try await response.body.collect(upTo: 64 << 20)
        } catch {
            throw EffectError("the endpoint's answer was over 64 MiB or cut short", retryable: false)
        }
        return (Data(body.readableBytesView), response.headers.first(name: "Content-Type") ?? "")
    }

    /// Runs blocking work (libvips, file copies) on the worker's `BlockingPool`, off the
    /// cooperative pool.
    func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        do {
            return try await BlockingPool.shared.run(work)
        } catch let overloaded as BlockingPool.Overloaded {
            throw EffectError("\(overloaded)", retryable: true)
        }
    }

    static func text(_ characters: [CChar]) -> String {
        String(decoding: characters.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

}
