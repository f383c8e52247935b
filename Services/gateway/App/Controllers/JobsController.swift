import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Messages
import ServiceLifecycle

/// Creating, following, cancelling and re-running edit jobs. Quota is reserved for the new job id
/// before the job is created, and released when creation definitely failed.
struct JobsController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let creator: JobCreator
    let links: DownloadLinks
    let streams: JobStreams

    struct CreateRequest: Decodable {
        var imageKey: String
        var effectId: String?
        var model: String?
        var parameters: [String: Double]?
        var prompt: String?
    }

    /// An effect as the app shows it: its price in credits and what it makes, with no processor,
    /// model or endpoint (those are the operator's).
    struct EffectView: Encodable {
        var id: String
        var title: String
        var credits: Int
        var kind: MediaKind
        var parameters: [EffectDescription.Parameter]
    }

    struct EffectsView: Encodable {
        var effects: [EffectView]
        /// Other names the app may send (`default`) and the effect each runs.
        var aliases: [String: String]
    }

    func addRoutes(to router: Router<Context>) {
        router.get("/api/v1/effects") { _, _ in
            let list = try await creator.prices.list()
            return try JSONResponse.make(.ok, EffectsView(
                effects: list.effects.map { EffectView(id: $0.id, title: $0.title, credits: $0.credits, kind: $0.kind, parameters: $0.parameters) },
                aliases: list.aliases
            ))
        }
        let router = router.authenticated(by: authenticator)
        router.post("/api/v1/jobs") { request, context in
            let caller = context.caller
            let body = try await JSONBody.decode(CreateRequest.self, from: request, context: context)
            // Neither named: the catalogue's default, as the Chat screen's `"model": "default"`.
            let effect = body.effectId ?? body.model ?? "default"
            return try await creator.create(
                caller: caller, imageKey: body.imageKey, effect: effect, parameters: body.parameters ?? [:],
                prompt: body.prompt, idempotencyKey: request.headers[.idempotencyKey], network: request.headers[.clientNetwork]
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
            return try events(request, first: job, userId: caller.id)
        }
        router.post("/api/v1/jobs/:jobId/cancel") { request, context in
            let caller = context.caller
            let job = try await clients.call(.jobs, Jobs.cancel, JobReference(jobId: try context.parameters.require("jobId"), userId: caller.id))
            return try JSONResponse.make(.ok, status(job))
        }
        router.post("/api/v1/jobs/:jobId/rerun") { request, context in
            let (caller, original) = try await ownedJob(request, context)
            return try await creator.create(
                caller: caller, imageKey: original.imageKey, version: original.imageETag, effect: original.effectId, parameters: original.parameters,
                prompt: original.prompt, idempotencyKey: request.headers[.idempotencyKey], network: request.headers[.clientNetwork]
            )
        }
    }

    /// The caller and the job named in the path, if it is theirs (404 otherwise).
    func ownedJob(_ request: Request, _ context: AuthenticatedContext<Context>) async throws -> (caller: Caller, job: JobRecord) {
        let caller = context.caller
        let job = try await clients.call(.jobs, Jobs.get, JobReference(jobId: try context.parameters.require("jobId"), userId: caller.id))
        return (caller, job)
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
        /// Credits reserved for the job (committed when it completes, given back otherwise).
        var credits: Int
        var createdAt: Date
        var updatedAt: Date
        var finishedAt: Date?
    }

    func url(_ key: String?) -> String? { links.url(key) }

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
            error: job.status == .failed ? job.lastError : nil, attempts: job.attempts, credits: job.credits,
            createdAt: job.createdAt, updatedAt: job.updatedAt, finishedAt: job.finishedAt
        )
    }

    /// Server-Sent Events: one `status` event per state change or progress step, fed by the
    /// gateway's `JobStreams`; closed after the terminal state, when the job is deleted, after
    /// 15 minutes (the client reconnects), or as soon as the client goes away. 503 past the open
    /// streams allowed.
    func events(_ request: Request, first: JobRecord, userId: String) throws -> Response {
        let subscription = try streams.open(first, userId: userId)
        let body = ResponseBody { writer in
            defer { subscription.close() }
            try await request.body.consumeWithInboundCloseHandler { _ in
                let encoder = JSONResponse.encoder
                var last: (Int, Double)? = nil
                let deadline = ContinuousClock.now.advanced(by: .seconds(900))
                func send(_ job: JobRecord) async throws {
                    if let last, last.0 > job.version || (last.0 == job.version && last.1 >= job.progress) { return }
                    last = (job.version, job.progress)
                    let data = try encoder.encode(status(job))
                    try await writer.write(ByteBuffer(string: "event: status\nid: \(job.version)\ndata: \(String(decoding: data, as: UTF8.self))\n\n"))
                }
                try await send(first)
                guard !first.status.isTerminal else { return }
                // A stopping gateway ends its streams: its HTTP server stops by waiting for every
                // answer to end, and a stream's job may not end for minutes (the client
                // reconnects, or polls, as after the 15 minutes).
                try await withGracefulShutdownHandler {
                    for await update in subscription.updates {
                        switch update {
                        case .status(let job):
                            try await send(job)
                            if job.status.isTerminal { return }
                        case .keepalive:
                            try await writer.write(ByteBuffer(string: ": keepalive\n\n"))
                        case .gone:
                            try await writer.write(ByteBuffer(string: "event: gone\ndata: {}\n\n"))
                            return
                        }
                        if ContinuousClock.now > deadline { return }
                    }
                } onGracefulShutdown: {
                    subscription.close()
                }
            } onInboundClosed: {
                // The client went away: end the stream now, not when the job ends.
                subscription.close()
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
