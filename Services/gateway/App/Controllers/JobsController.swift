import Blobs
import Bus
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// Creating, following, cancelling and re-running edit jobs. Quota is reserved for the new job id
/// before the job is created, and released when creation definitely failed.
struct JobsController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let blobs: DiskBlobStore
    let signer: URLSigner
    let publicBaseURL: String
    let lifetime: Int

    struct CreateRequest: Decodable {
        var imageKey: String
        var effectId: String?
        var model: String?
        var parameters: [String: Double]?
        var prompt: String?
    }

    struct Accepted: Encodable {
        var jobId: String
        var status: JobStatus
        var createdAt: Date
    }

    func addRoutes(to router: Router<Context>) {
        router.post("/api/v1/jobs") { request, context in
            let caller = try await authenticator.caller(of: request)
            let body = try await JSONBody.decode(CreateRequest.self, from: request, context: context)
            guard let effect = body.effectId ?? body.model else {
                throw Problem(.badRequest, detail: "Name the edit with effectId (or model).")
            }
            return try await create(
                caller: caller, imageKey: body.imageKey, effect: effect, parameters: body.parameters ?? [:],
                prompt: body.prompt, idempotencyKey: request.headers[.idempotencyKey]
            )
        }
        router.get("/api/v1/jobs/:jobId") { request, context in
            try JSONResponse.make(.ok, view(try await ownedJob(request, context).job))
        }
        router.get("/api/v1/jobs/:jobId/status") { request, context in
            try JSONResponse.make(.ok, status(try await ownedJob(request, context).job))
        }
        router.get("/api/v1/jobs/:jobId/events") { request, context in
            let (caller, job) = try await ownedJob(request, context)
            return events(JobReference(jobId: job.id, userId: caller.id), first: job)
        }
        router.post("/api/v1/jobs/:jobId/cancel") { request, context in
            let caller = try await authenticator.caller(of: request)
            let job = try await clients.call(.jobs, Jobs.cancel, JobReference(jobId: try context.parameters.require("jobId"), userId: caller.id))
            return try JSONResponse.make(.ok, status(job))
        }
        router.post("/api/v1/jobs/:jobId/rerun") { request, context in
            let (caller, original) = try await ownedJob(request, context)
            return try await create(
                caller: caller, imageKey: original.imageKey, effect: original.effectId, parameters: original.parameters,
                prompt: original.prompt, idempotencyKey: request.headers[.idempotencyKey]
            )
        }
    }

    /// The caller and the job named in the path, if it is theirs (404 otherwise).
    func ownedJob(_ request: Request, _ context: Context) async throws -> (caller: Caller, job: JobRecord) {
        let caller = try await authenticator.caller(of: request)
        let job = try await clients.call(.jobs, Jobs.get, JobReference(jobId: try context.parameters.require("jobId"), userId: caller.id))
        return (caller, job)
    }

    /// Validates, reserves quota for the job id, creates the job; releases on a definite failure.
    func create(caller: Caller, imageKey: String, effect: String, parameters: [String: Double], prompt: String?, idempotencyKey: String?) async throws -> Response {
        guard BlobKey.isValid(imageKey), let image = try await blobs.metadata(of: imageKey), image.owner == caller.id else {
            throw Problem(.notFound, detail: "No uploaded image \(imageKey.prefix(100)).")
        }
        let jobId = try Self.jobId(user: caller.id, idempotencyKey: idempotencyKey)
        let decision = try await clients.call(.quota, Quota.reserve, ReserveQuota(userId: caller.id, jobId: jobId, cost: 1))
        guard decision.admitted else {
            throw RateLimitHeaders.problem(for: decision, now: Date())
        }
        let job: JobRecord
        do {
            job = try await clients.client(for: .jobs).call(Jobs.create, CreateJob(
                jobId: jobId, userId: caller.id, isPro: decision.status.isPro, imageKey: imageKey,
                effectId: effect, parameters: parameters, prompt: prompt
            ))
        } catch {
            // A definite answer means no job exists: give the units back. A timeout may hide a
            // created job; quota resolves such reservations by asking jobs later.
            if error.code != .timeout {
                _ = try? await clients.client(for: .quota).call(Quota.release, ChargeReference(jobId: jobId))
            }
            throw Problem(error, service: "jobs")
        }
        return try JSONResponse.make(
            .accepted, Accepted(jobId: job.id, status: job.status, createdAt: job.createdAt),
            headers: [.location: "/api/v1/jobs/\(job.id)"] + RateLimitHeaders.headers(for: decision.status, now: Date())
        )
    }

    /// With an `Idempotency-Key`, the job id is derived from (user, key): the same request sent
    /// again names the same job, which is created and charged once.
    static func jobId(user: String, idempotencyKey: String?) throws -> String {
        guard let key = idempotencyKey else { return UUID().uuidString.lowercased() }
        guard (1...255).contains(key.utf8.count) else {
            throw Problem(.badRequest, detail: "Idempotency-Key must be 1 to 255 characters.")
        }
        var bytes = Array(SHA256.hash(data: Data("\(user)\n\(key)".utf8)).prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x50  // name-based UUID layout
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                               bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
        return uuid.uuidString.lowercased()
    }

    struct StatusView: Encodable {
        var jobId: String
        var status: JobStatus
        var progress: Double
        var resultUrl: String?
        var thumbnailUrl: String?
        var error: String?
    }

    struct JobView: Encodable {
        var id: String
        var status: JobStatus
        var progress: Double
        var effectId: String
        var parameters: [String: Double]
        var prompt: String?
        var originalImageKey: String
        var resultUrl: String?
        var thumbnailUrl: String?
        var error: String?
        var attempts: Int
        var createdAt: Date
        var updatedAt: Date
        var finishedAt: Date?
    }

    func url(_ key: String?) -> String? {
        key.map { publicBaseURL + signer.downloadPath(for: $0, lifetime: lifetime) }
    }

    func status(_ job: JobRecord) -> StatusView {
        StatusView(
            jobId: job.id, status: job.status, progress: job.progress,
            resultUrl: job.status == .completed ? url(job.resultKey) : nil,
            thumbnailUrl: job.status == .completed ? url(job.thumbnailKey) : nil,
            error: job.status == .failed ? job.lastError : nil
        )
    }

    func view(_ job: JobRecord) -> JobView {
        JobView(
            id: job.id, status: job.status, progress: job.progress, effectId: job.effectId, parameters: job.parameters,
            prompt: job.prompt, originalImageKey: job.imageKey,
            resultUrl: job.status == .completed ? url(job.resultKey) : nil,
            thumbnailUrl: job.status == .completed ? url(job.thumbnailKey) : nil,
            error: job.status == .failed ? job.lastError : nil, attempts: job.attempts,
            createdAt: job.createdAt, updatedAt: job.updatedAt, finishedAt: job.finishedAt
        )
    }

    /// Server-Sent Events: one `status` event per state change or progress step, closed after
    /// the terminal state (or after 15 minutes; the client reconnects).
    func events(_ reference: JobReference, first: JobRecord) -> Response {
        let body = ResponseBody { writer in
            let encoder = JSONResponse.encoder()
            var last: (Int, Double)? = nil
            var job = first
            let deadline = ContinuousClock.now.advanced(by: .seconds(900))
            while true {
                if last == nil || last! != (job.version, job.progress) {
                    last = (job.version, job.progress)
                    let data = try encoder.encode(status(job))
                    try await writer.write(ByteBuffer(string: "event: status\nid: \(job.version)\ndata: \(String(decoding: data, as: UTF8.self))\n\n"))
                }
                if job.status.isTerminal || ContinuousClock.now > deadline { break }
                try await Task.sleep(for: .milliseconds(250))
                job = try await clients.client(for: .jobs).call(Jobs.get, reference)
            }
            try await writer.finish(nil)
        }
        return Response(
            status: .ok,
            headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"],
            body: body
        )
    }
}

extension HTTPField.Name {
    /// `Idempotency-Key`: the same key from the same user names the same job.
    public static let idempotencyKey = HTTPField.Name("Idempotency-Key")!
}

extension HTTPFields {
    static func + (lhs: HTTPFields, rhs: HTTPFields) -> HTTPFields {
        var fields = lhs
        fields.append(contentsOf: rhs)
        return fields
    }
}
