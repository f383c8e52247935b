import Foundation
import HTTPTypes
import OpenAPIRuntime
import OpenAPIURLSession
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What the app calls: the gateway's API through the client generated from `openapi.yaml`, with
/// what the app wants on top: who is calling, typed errors from problem+json, an
/// `Idempotency-Key` kept across a creation's own retries, a job's updates and history pages as
/// `AsyncSequence`s. The presigned upload is by hand: its URL is opaque, signed by the gateway.
public struct PhotoEditClient: Sendable {
    /// Who is calling: a user with a token from the app's sign-in, or a guest by device id.
    public enum Identity: Sendable {
        case token(@Sendable () async throws -> String)
        case guest(deviceId: UUID)
    }

    let baseURL: URL
    let identity: Identity
    let session: URLSession
    let api: Client
    /// How often a job is polled where Server-Sent Events are not available.
    public var pollInterval: Duration = .seconds(2)

    public init(baseURL: URL, identity: Identity, session: URLSession = .shared) {
        self.baseURL = baseURL
        self.identity = identity
        self.session = session
        self.api = Client(
            serverURL: baseURL,
            configuration: Configuration(dateTranscoder: .iso8601),
            transport: URLSessionTransport(configuration: .init(session: session)),
            middlewares: [IdentityMiddleware(identity: identity), ProblemMiddleware()]
        )
    }

    // MARK: Users

    /// The caller and their quota.
    public func me() async throws(PhotoEditError) -> Me {
        let me = try await call { try await api.me().ok.body.json }
        return Me(
            id: me.id, email: me.email, isGuest: me.isGuest, isPro: me.isPro, plan: me.plan, planEndsAt: me.planEndsAt,
            quota: Quota(me.quota)
        )
    }

    /// The quota alone (the Chat screen's badge).
    public func credits() async throws(PhotoEditError) -> Quota {
        try await call { Quota(try await api.credits().ok.body.json.value1) }
    }

    /// The effects the app can offer.
    public func effects() async throws(PhotoEditError) -> [Effect] {
        try await call {
            try await api.effects().ok.body.json.effects.map { effect in
                Effect(id: effect.id, title: effect.title, credits: effect.credits, kind: effect.kind.rawValue, parameters: effect.parameters.map {
                    Effect.Parameter(name: $0.name, minimum: $0.minimum, maximum: $0.maximum, defaultValue: $0.defaultValue)
                })
            }
        }
    }

    // MARK: Uploads

    /// Uploads an image (JPEG, PNG, WebP or HEIC, told by its bytes) through a presigned URL;
    /// returns its image key.
    public func upload(_ imageData: Data, filename: String = "photo") async throws(PhotoEditError) -> String {
        guard let contentType = Self.contentType(of: imageData) else {
            throw .badRequest("the data is not a JPEG, PNG, WebP or HEIC image")
        }
        let grant = try await call {
            try await api.presignUpload(body: .json(.init(filename: filename, contentType: .init(rawValue: contentType)!))).ok.body.json
        }
        guard let url = URL(string: grant.uploadUrl) else { throw .server(status: 0, detail: "the upload URL is not a URL") }
        var request = URLRequest(url: url)
        request.httpMethod = "PUT"
        request.setValue(contentType, forHTTPHeaderField: "Content-Type")
        // The headers the grant names are signed into the URL: sent as they are. Then
        // `If-None-Match: *`, which no store requires: an object store writes the key once with
        // it (the gateway's own upload route always does).
        for (name, value) in grant.headers.additionalProperties { request.setValue(value, forHTTPHeaderField: name) }
        request.setValue("*", forHTTPHeaderField: "If-None-Match")
        let (data, response) = try await send(request, body: imageData)
        // 201 from the gateway's own upload route, 200 from an object store.
        guard response.statusCode == 201 || response.statusCode == 200 else { throw PhotoEditError(status: response.statusCode, problem: data) }
        return grant.imageKey
    }

    // MARK: Jobs

    /// Starts an edit. The same `Idempotency-Key` goes with every retry of this call (after a
    /// network failure or a 503), so the job is created and charged once.
    public func createJob(imageKey: String, effect: String, parameters: [String: Double] = [:], prompt: String? = nil,
                          idempotencyKey: String = UUID().uuidString, attempts: Int = 3) async throws(PhotoEditError) -> JobTicket {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await call {
                    let accepted = try await api.createJob(
                        headers: .init(idempotencyKey: idempotencyKey),
                        body: .json(.init(imageKey: imageKey, effectId: effect, parameters: .init(additionalProperties: parameters), prompt: prompt))
                    ).accepted.body.json
                    return JobTicket(jobId: accepted.jobId, status: accepted.status.rawValue, createdAt: accepted.createdAt)
                }
            } catch where attempt < attempts && error.isTransient {
                try? await Task.sleep(for: .milliseconds(200 * attempt))
            }
        }
    }

    /// A job's state now.
    public func status(of jobId: String) async throws(PhotoEditError) -> JobUpdate {
        try await call { JobUpdate(try await api.jobStatus(path: .init(jobId: jobId)).ok.body.json) }
    }

    /// A job's updates until it ends (the last one is completed, failed or cancelled): from the
    /// job's Server-Sent Events where URLSession can stream them (Apple platforms), falling back
    /// to polling every `pollInterval` when the stream fails or cannot be had (Linux's
    /// URLSession does not stream).
    public func updates(of jobId: String) -> AsyncThrowingStream<JobUpdate, any Error> {
        let interval = pollInterval
        return AsyncThrowingStream { continuation in
            let task = Task {
                var last: JobUpdate?
                do {
                    #if !canImport(FoundationNetworking)
                    last = try? await streamEvents(of: jobId) { update in
                        continuation.yield(update)
                    }
                    if let last, last.isFinished {
                        continuation.finish()
                        return
                    }
                    #endif
                    while !Task.isCancelled {
                        let update = try await status(of: jobId)
                        if update != last { continuation.yield(update) }
                        last = update
                        if update.isFinished { break }
                        try await Task.sleep(for: interval)
                    }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    #if !canImport(FoundationNetworking)
    /// Reads `GET /api/v1/jobs/{id}/events` until the job ends or the stream does; hands each
    /// `status` event to `yield`; returns the last one.
    func streamEvents(of jobId: String, yield: (JobUpdate) -> Void) async throws -> JobUpdate? {
        var request = URLRequest(url: baseURL.appendingPathComponent("api/v1/jobs/\(jobId)/events"))
        request.setValue("text/event-stream", forHTTPHeaderField: "Accept")
        switch identity {
        case .guest(let deviceId): request.setValue(deviceId.uuidString, forHTTPHeaderField: "X-Device-Id")
        case .token(let token): request.setValue("Bearer \(try await token())", forHTTPHeaderField: "Authorization")
        }
        let (bytes, response) = try await session.bytes(for: request)
        guard (response as? HTTPURLResponse)?.statusCode == 200 else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        var last: JobUpdate?
        for try await line in bytes.lines where line.hasPrefix("data:") {
            guard let view = try? decoder.decode(Components.Schemas.JobStatusView.self, from: Data(line.dropFirst(5).utf8)) else { continue }
            let update = JobUpdate(view)
            yield(update)
            last = update
            if update.isFinished { break }
        }
        return last
    }
    #endif

    /// Cancels a job.
    public func cancel(_ jobId: String) async throws(PhotoEditError) -> JobUpdate {
        try await call { JobUpdate(try await api.cancelJob(path: .init(jobId: jobId)).ok.body.json) }
    }

    /// A new, charged job with the same image, effect and parameters.
    public func rerun(_ jobId: String, idempotencyKey: String = UUID().uuidString) async throws(PhotoEditError) -> JobTicket {
        try await call {
            let accepted = try await api.rerunJob(path: .init(jobId: jobId), headers: .init(idempotencyKey: idempotencyKey)).accepted.body.json
            return JobTicket(jobId: accepted.jobId, status: accepted.status.rawValue, createdAt: accepted.createdAt)
        }
    }

    /// Downloads a result or thumbnail from its signed URL.
    public func download(_ url: String) async throws(PhotoEditError) -> Data {
        guard let url = URL(string: url) else { throw .badRequest("not a URL") }
        let (data, response) = try await send(URLRequest(url: url), body: nil)
        guard response.statusCode == 200 else { throw PhotoEditError(status: response.statusCode, problem: data) }
        return data
    }

    // MARK: History

    /// One page of the caller's history, newest first.
    public func historyPage(cursor: String? = nil, limit: Int = 50, statuses: [String] = [], search: String? = nil) async throws(PhotoEditError) -> HistoryPage {
        try await call {
            let page = try await api.history(query: .init(
                limit: limit, cursor: cursor, status: statuses.isEmpty ? nil : statuses.joined(separator: ","), q: search
            )).ok.body.json
            return HistoryPage(items: page.items.map(HistoryItem.init), totalCount: page.totalCount, hasMore: page.hasMore, nextCursor: page.nextCursor)
        }
    }

    /// The caller's history, page after page, as long as the caller iterates.
    public func history(pageSize: Int = 50, statuses: [String] = [], search: String? = nil) -> AsyncThrowingStream<HistoryPage, any Error> {
        AsyncThrowingStream { continuation in
            let task = Task {
                var cursor: String?
                do {
                    repeat {
                        let page = try await historyPage(cursor: cursor, limit: pageSize, statuses: statuses, search: search)
                        continuation.yield(page)
                        cursor = page.hasMore ? page.nextCursor : nil
                    } while cursor != nil && !Task.isCancelled
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Upserts and deletions since `token` (nil: from the beginning), for an offline copy.
    public func historyChanges(since token: String?, limit: Int = 200) async throws(PhotoEditError) -> HistoryChanges {
        try await call {
            let answer = try await api.historyChanges(query: .init(since: token, limit: limit)).ok.body.json
            return HistoryChanges(
                changes: answer.changes.map { change in
                    change.op == .upsert ? .upsert(HistoryItem(change.item!)) : .delete(change.id ?? "")
                },
                nextToken: answer.nextToken, hasMore: answer.hasMore
            )
        }
    }

    /// Deletes an edit for good.
    public func delete(_ jobId: String) async throws(PhotoEditError) {
        _ = try await call { try await api.deleteHistoryItem(path: .init(jobId: jobId)).ok }
    }

    /// A public link to a completed edit's result.
    public func share(_ jobId: String) async throws(PhotoEditError) -> ShareLink {
        try await call {
            let link = try await api.shareHistoryItem(path: .init(jobId: jobId)).created.body.json
            return ShareLink(url: link.shareUrl, expiresAt: link.expiresAt)
        }
    }

    // MARK: Plumbing

    /// Runs a generated call; whatever it throws becomes a `PhotoEditError`.
    func call<T>(_ body: () async throws -> T) async throws(PhotoEditError) -> T {
        do {
            return try await body()
        } catch {
            throw PhotoEditError(error)
        }
    }

    /// Sends a request by hand with the caller's identity (the upload and downloads).
    func send(_ request: URLRequest, body: Data?) async throws(PhotoEditError) -> (Data, HTTPURLResponse) {
        var request = request
        do {
            switch identity {
            case .guest(let deviceId): request.setValue(deviceId.uuidString, forHTTPHeaderField: "X-Device-Id")
            case .token(let token): request.setValue("Bearer \(try await token())", forHTTPHeaderField: "Authorization")
            }
            let (data, response): (Data, URLResponse)
            if let body {
                (data, response) = try await session.upload(for: request, from: body)
            } else {
                (data, response) = try await session.data(for: request)
            }
            guard let http = response as? HTTPURLResponse else { throw PhotoEditError.server(status: 0, detail: "not an HTTP answer") }
            return (data, http)
        } catch {
            throw PhotoEditError(error)
        }
    }

    /// The image type of `data` from its first bytes.
    static func contentType(of data: Data) -> String? {
        let bytes = [UInt8](data.prefix(12))
        if bytes.starts(with: [0xFF, 0xD8, 0xFF]) { return "image/jpeg" }
        if bytes.starts(with: [0x89, 0x50, 0x4E, 0x47]) { return "image/png" }
        if bytes.count >= 12, bytes.starts(with: Array("RIFF".utf8)), Array(bytes[8..<12]) == Array("WEBP".utf8) { return "image/webp" }
        if bytes.count >= 12, Array(bytes[4..<8]) == Array("ftyp".utf8) { return "image/heic" }
        return nil
    }
}

/// Adds the caller's identity to every generated call.
struct IdentityMiddleware: ClientMiddleware {
    let identity: PhotoEditClient.Identity

    func intercept(_ request: HTTPRequest, body: HTTPBody?, baseURL: URL, operationID: String,
                   next: @Sendable (HTTPRequest, HTTPBody?, URL) async throws -> (HTTPResponse, HTTPBody?)) async throws -> (HTTPResponse, HTTPBody?) {
        var request = request
        switch identity {
        case .guest(let deviceId): request.headerFields[HTTPField.Name("X-Device-Id")!] = deviceId.uuidString
        case .token(let token): request.headerFields[.authorization] = "Bearer \(try await token())"
        }
        return try await next(request, body, baseURL)
    }
}

/// Turns every error answer into a typed `PhotoEditError` from its problem+json body, before the
/// generated code looks at it.
struct ProblemMiddleware: ClientMiddleware {
    func intercept(_ request: HTTPRequest, body: HTTPBody?, baseURL: URL, operationID: String,
                   next: @Sendable (HTTPRequest, HTTPBody?, URL) async throws -> (HTTPResponse, HTTPBody?)) async throws -> (HTTPResponse, HTTPBody?) {
        let (response, responseBody) = try await next(request, body, baseURL)
        guard response.status.code >= 400 else { return (response, responseBody) }
        var data = Data()
        if let responseBody { data = try await Data(collecting: responseBody, upTo: 1 << 20) }
        var error = PhotoEditError(status: response.status.code, problem: data)
        if case .quotaExceeded(let windows, _, let plan) = error, let retry = response.headerFields[.retryAfter].flatMap({ Int($0) }) {
            error = .quotaExceeded(windows: windows, retryAfter: retry, plan: plan)
        }
        throw error
    }
}
