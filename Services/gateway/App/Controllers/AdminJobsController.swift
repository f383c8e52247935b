import Blobs
import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// The operators' view of jobs across all users (`/admin/v1/jobs`) and the audit log
/// (`/admin/v1/audit`). Reads take the admin or the viewer token; actions the admin token only
/// (a viewer's action is 403), and each action is written to the audit log.
struct AdminJobsController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let links: DownloadLinks
    let blobs: any BlobStore

    /// A job as operators read it: the app's fields and what support needs besides (the user,
    /// the provider's request id, the trace id, the error in full).
    struct JobJSON: Encodable {
        var id: String
        var userId: String
        var status: String
        var effect: String
        var prompt: String?
        var credits: Int
        var attempts: Int
        var maxAttempts: Int
        var progress: Double
        var error: String?
        var cancelRequested: Bool
        var createdAt: Date
        var updatedAt: Date
        var startedAt: Date?
        var finishedAt: Date?
        var providerRequestId: String?
        var traceId: String?

        init(_ job: JobRecord) {
            id = job.id
            userId = job.userId
            status = job.status.rawValue
            effect = job.effectId
            prompt = job.prompt
            credits = job.credits
            attempts = job.attempts
            maxAttempts = job.maxAttempts
            progress = job.progress
            error = job.lastError
            cancelRequested = job.cancelRequested
            createdAt = job.createdAt
            updatedAt = job.updatedAt
            startedAt = job.startedAt
            finishedAt = job.finishedAt
            providerRequestId = job.submission?.requestId
            // W3C traceparent: version-traceid-parentid-flags
            traceId = job.traceParent.flatMap { $0.split(separator: "-").dropFirst().first.map(String.init) }
        }
    }

    struct PageJSON: Encodable {
        var jobs: [JobJSON]
        var nextCursor: String?
        var counts: [String: Int]
    }

    /// One job in detail: its settlement and its files as signed links besides.
    struct DetailJSON: Encodable {
        var job: JobJSON
        /// How its credits stand: `reserved` while it runs, `committed` once completed,
        /// `released` (given back) once failed or cancelled.
        var settlement: String
        var inputUrl: String?
        var resultUrl: String?
        var thumbnailUrl: String?
        /// Its attempts, first to last: worker, start, end, outcome, error.
        var attempts: [AttemptRecord]
    }

    /// The most ids one action names (so that its body fits the 64 KiB of a JSON body); a
    /// filter reaches `AdminJobsAction.maxJobs`.
    static var maxIds: Int { 200 }

    struct ActionBody: Decodable {
        var ids: [String]?
        var filter: FilterBody?
        /// Whether the body names a filter at all (`"filter": null` too: either ids or a filter).
        var namesFilter: Bool
        var namesIds: Bool

        enum CodingKeys: String, CodingKey { case ids, filter }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            ids = try container.decodeIfPresent([String].self, forKey: .ids)
            filter = try container.decodeIfPresent(FilterBody.self, forKey: .filter)
            namesIds = container.contains(.ids)
            namesFilter = container.contains(.filter)
        }
    }

    /// A filter as JSON (the query's names).
    struct FilterBody: Decodable {
        var state: String?
        var effect: String?
        var provider: String?
        var user: String?
        var error: String?
        var from: String?
        var to: String?
    }

    func addRoutes(to router: Router<Context>) {
        router.get("/admin/v1/jobs") { request, _ in
            try authenticator.requireOperator(request)
            let query = request.uri.queryParameters
            let filter = try Self.filter(FilterBody(
                state: query["state"].map(String.init), effect: query["effect"].map(String.init), provider: query["provider"].map(String.init),
                user: query["user"].map(String.init), error: query["error"].map(String.init), from: query["from"].map(String.init),
                to: query["to"].map(String.init)
            ))
            var limit = 50
            if let text = query["limit"] {
                guard let value = Int(text), (1...AdminJobsQuery.maxLimit).contains(value) else {
                    throw Problem(.badRequest, detail: "limit must be 1 to \(AdminJobsQuery.maxLimit).")
                }
                limit = value
            }
            let cursor = query["cursor"].map(String.init).flatMap { $0.isEmpty ? nil : $0 }
            let page = try await clients.call(.jobs, Admin.jobs, AdminJobsQuery(filter: filter, cursor: cursor, limit: limit))
            return try JSONResponse.make(.ok, PageJSON(jobs: page.jobs.map(JobJSON.init), nextCursor: page.nextCursor, counts: page.counts))
        }
        // A job's files through the gateway, under the operator's token: the console shows them
        // without a signed link ever reaching the page.
        router.get("/admin/v1/jobs/:jobId/files/:kind") { request, context in
            try authenticator.requireOperator(request)
            let jobId = try context.parameters.require("jobId")
            let job = try await clients.call(.jobs, Admin.job, AdminJobReference(jobId: jobId))
            let key: String? = switch try context.parameters.require("kind") {
            case "input": job.imageKey
            case "result": job.resultKey
            case "thumbnail": job.thumbnailKey
            default: throw Problem(.notFound, detail: "A job's files are input, result and thumbnail.")
            }
            guard let key else { throw Problem(.notFound, detail: "The job has no such file (yet).") }
            return try await UploadsController<Context>.serve(blobs, key: key, cacheControl: "private, no-store")
        }
        router.get("/admin/v1/session") { request, _ in
            try JSONResponse.make(.ok, ["role": try authenticator.requireOperator(request).rawValue])
        }
        router.get("/admin/v1/jobs/:jobId") { request, context in
            try authenticator.requireOperator(request)
            let jobId = try context.parameters.require("jobId")
            async let attempts = clients.call(.jobs, Admin.attempts, AdminJobReference(jobId: jobId))
            let page = try await clients.call(.jobs, Admin.job, AdminJobReference(jobId: jobId))
            let settlement = switch page.status {
            case .completed: "committed"
            case .failed, .cancelled: "released"
            case .queued, .processing: "reserved"
            }
            return try JSONResponse.make(.ok, DetailJSON(
                job: JobJSON(page), settlement: settlement, inputUrl: links.url(page.imageKey), resultUrl: links.url(page.resultKey),
                thumbnailUrl: links.url(page.thumbnailKey), attempts: try await attempts
            ))
        }
        for (path, method) in [("cancel", Admin.cancel), ("retry", Admin.retry)] {
            router.post("/admin/v1/jobs/\(path)") { request, context in
                try authenticator.requireAdmin(request)
                let body = try await JSONBody.decode(ActionBody.self, from: request, context: context)
                return try JSONResponse.make(.ok, try await clients.call(.jobs, method, try Self.action(body)))
            }
        }
        router.get("/admin/v1/audit") { request, _ in
            try authenticator.requireOperator(request)
            let query = request.uri.queryParameters
            let before = try query["before"].map { text -> Int64 in
                guard let value = Int64(text) else { throw Problem(.badRequest, detail: "before must be an entry's id.") }
                return value
            }
            let limit = try query["limit"].map { text -> Int in
                guard let value = Int(text), (1...500).contains(value) else { throw Problem(.badRequest, detail: "limit must be 1 to 500.") }
                return value
            } ?? 100
            return try JSONResponse.make(.ok, try await clients.call(.jobs, Admin.auditLog, AuditQuery(before: before, limit: limit)))
        }
    }

    /// An action's body: either ids or a filter.
    static func action(_ body: ActionBody) throws -> AdminJobsAction {
        guard body.namesIds != body.namesFilter else { throw Problem(.badRequest, detail: "Send either ids or filter.") }
        switch (body.ids, body.filter) {
        case (let ids?, nil):
            guard !ids.isEmpty, ids.count <= Self.maxIds, ids.allSatisfy({ (1...256).contains($0.utf8.count) }) else {
                throw Problem(.badRequest, detail: "ids names 1 to \(Self.maxIds) jobs, each id 1 to 256 bytes.")
            }
            return AdminJobsAction(ids: ids, actor: "admin")
        case (nil, let filter?):
            return AdminJobsAction(filter: try Self.filter(filter), actor: "admin")
        default:
            throw Problem(.badRequest, detail: "Send either ids or filter.")
        }
    }

    /// A filter from its text fields; anything malformed is a 400 naming it.
    static func filter(_ body: FilterBody) throws -> AdminJobFilter {
        func date(_ text: String?, _ name: String) throws -> Date? {
            guard let text else { return nil }
            guard let date = RFC3339.date(text) else { throw Problem(.badRequest, detail: "\(name) must be an RFC 3339 date and time.") }
            return date
        }
        var state: JobStatus?
        if let text = body.state, !text.isEmpty {
            guard let parsed = JobStatus(rawValue: text) else {
                throw Problem(.badRequest, detail: "state must be one of \(JobStatus.allCases.map(\.rawValue).joined(separator: ", ")).")
            }
            state = parsed
        }
        for (name, value) in [("effect", body.effect), ("provider", body.provider), ("user", body.user), ("error", body.error)] {
            if let value, value.utf8.count > 256 { throw Problem(.badRequest, detail: "\(name) is longer than 256 bytes.") }
        }
        func text(_ value: String?) -> String? { value.flatMap { $0.isEmpty ? nil : $0 } }
        return AdminJobFilter(
            state: state, effect: text(body.effect), provider: text(body.provider), userId: text(body.user), error: text(body.error),
            from: try date(body.from, "from"), to: try date(body.to, "to")
        )
    }
}
