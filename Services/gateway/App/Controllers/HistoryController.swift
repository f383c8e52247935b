import Blobs
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// The History screen's routes: pages of past edits (filtered, searched, in month sections), one
/// item, delete, re-run, share links, and the changes feed of offline clients.
struct HistoryController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let creator: JobCreator
    let links: DownloadLinks
    /// Seconds a share link lives (`SHARE_TTL_S`).
    let shareLifetime: Int

    func addRoutes(to router: Router<Context>) {
        let router = router.authenticated(by: authenticator)
        router.get("/api/v1/history") { request, context in
            let caller = context.caller
            var list = try HistoryQuery.list(request.uri.queryParameters, userId: caller.id)
            if list.groupByMonth {
                let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
                list.timeZone = status.timeZone
                list.locale = HistoryQuery.language(request.headers[.acceptLanguage])
            }
            let page = try await clients.call(.history, History.page, list)
            return try HistoryJSON.response(links: links, capacity: 512 + page.headText.utf8.count + page.count * 512) { try $0.page(page) }
        }
        router.get("/api/v1/history/changes") { request, context in
            let caller = context.caller
            let query = request.uri.queryParameters
            let limit = try HistoryQuery.integer(query["limit"], name: "limit", default: 200, range: 1...500)
            let since = query["since"].map(String.init).flatMap { $0.isEmpty ? nil : $0 }
            let changes = try await clients.call(.history, History.changes, ChangesSince(userId: caller.id, token: since, limit: limit))
            return HistoryJSON.response(links: links, capacity: 256 + changes.changes.count * 1024) { $0.changes(changes) }
        }
        router.get("/api/v1/history/:jobId") { request, context in
            let (_, item) = try await ownedItem(request, context)
            return HistoryJSON.response(links: links) { $0.item(item) }
        }
        router.delete("/api/v1/history/:jobId") { request, context in
            let caller = context.caller
            let deleted = try await clients.call(.history, History.delete, HistoryItemReference(userId: caller.id, jobId: try context.parameters.require("jobId")))
            return try JSONResponse.make(.ok, Deleted(deletedItemId: deleted.jobId))
        }
        router.post("/api/v1/history/:jobId/rerun") { request, context in
            let (caller, item) = try await ownedItem(request, context)
            // The version of the image its job was created from, while jobs keeps the job.
            let version = try? await clients.call(.jobs, Jobs.get, JobReference(jobId: item.jobId, userId: caller.id)).imageETag
            return try await creator.create(
                caller: caller, imageKey: item.originalImageKey, version: version, effect: item.effectId, parameters: item.parameters,
                prompt: item.prompt, idempotencyKey: request.headers[.idempotencyKey], network: request.headers[.clientNetwork]
            )
        }
        router.post("/api/v1/history/:jobId/share") { request, context in
            let caller = context.caller
            let grant = try await clients.call(.history, History.share, ShareItem(
                userId: caller.id, jobId: try context.parameters.require("jobId"), lifetimeSeconds: shareLifetime
            ))
            return try JSONResponse.make(.created, Shared(shareUrl: links.publicBaseURL + "/s/" + grant.token, expiresAt: grant.expiresAt))
        }
        router.delete("/api/v1/history/:jobId/share") { request, context in
            let caller = context.caller
            _ = try await clients.call(.history, History.unshare, HistoryItemReference(userId: caller.id, jobId: try context.parameters.require("jobId")))
            return Response(status: .noContent)
        }
    }

    /// The caller and the item named in the path, if it is theirs (404 otherwise).
    func ownedItem(_ request: Request, _ context: AuthenticatedContext<Context>) async throws -> (caller: Caller, item: HistoryItem) {
        let caller = context.caller
        let item = try await clients.call(.history, History.get, HistoryItemReference(userId: caller.id, jobId: try context.parameters.require("jobId")))
        return (caller, item)
    }

    struct Deleted: Encodable {
        var success = true
        var deletedItemId: String
    }

    struct Shared: Encodable {
        var shareUrl: String
        var expiresAt: Date
    }
}

/// Reads the history routes' query parameters; anything malformed is a 400 naming the parameter.
enum HistoryQuery {
    static func list(_ query: Parameters, userId: String) throws -> ListHistory {
        var statuses: [HistoryStatus] = []
        for value in query.getAll("status") {
            for name in value.split(separator: ",") where !name.isEmpty {
                guard let status = HistoryStatus(rawValue: String(name)) else {
                    throw Problem(.badRequest, detail: "status must be completed, processing, failed or cancelled (one or several).")
                }
                statuses.append(status)
            }
        }
        let groupBy = query["groupBy"].map(String.init)
        guard groupBy == nil || groupBy == "" || groupBy == "month" else {
            throw Problem(.badRequest, detail: "groupBy can only be month.")
        }
        let q = query["q"].map(String.init).flatMap { $0.isEmpty ? nil : $0 }
        if let q, q.utf8.count > 200 { throw Problem(.badRequest, detail: "q must be at most 200 bytes.") }
        let cursor = query["cursor"].map(String.init).flatMap { $0.isEmpty ? nil : $0 }
        return ListHistory(
            userId: userId,
            limit: try integer(query["limit"], name: "limit", default: 50, range: 1...100),
            offset: try integer(query["offset"], name: "offset", default: 0, range: 0...1_000_000),
            cursor: cursor, statuses: statuses, query: q, groupByMonth: groupBy == "month"
        )
    }

    static func integer(_ text: Substring?, name: String, default value: Int, range: ClosedRange<Int>) throws -> Int {
        guard let text else { return value }
        guard let number = Int(text), range.contains(number) else {
            throw Problem(.badRequest, detail: "\(name) must be an integer from \(range.lowerBound) to \(range.upperBound).")
        }
        return number
    }

    /// The first language of an `Accept-Language` header (`de-DE,de;q=0.9` → `de-DE`).
    static func language(_ header: String?) -> String? {
        guard let header else { return nil }
        let first = header.split(separator: ",").first?.split(separator: ";").first?.trimmingCharacters(in: .whitespaces) ?? ""
        return first.isEmpty || first == "*" ? nil : first
    }
}
