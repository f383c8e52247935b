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
        let router = router.group().add(middleware: AuthenticationMiddleware(authenticator: authenticator))
        router.get("/api/v1/history") { request, context in
            let caller = try context.caller()
            var list = try HistoryQuery.list(request.uri.queryParameters, userId: caller.id)
            if list.groupByMonth {
                let status = try await clients.call(.quota, Quota.status, UserReference(userId: caller.id))
                list.timeZone = status.timeZone
                list.locale = HistoryQuery.language(request.headers[.acceptLanguage])
            }
            let page = try await clients.call(.history, History.list, list)
            return try JSONResponse.make(.ok, PageView(page, links: links))
        }
        router.get("/api/v1/history/changes") { request, context in
            let caller = try context.caller()
            let query = request.uri.queryParameters
            let limit = try HistoryQuery.integer(query["limit"], name: "limit", default: 200, range: 1...500)
            let since = query["since"].map(String.init).flatMap { $0.isEmpty ? nil : $0 }
            let changes = try await clients.call(.history, History.changes, ChangesSince(userId: caller.id, token: since, limit: limit))
            return try JSONResponse.make(.ok, ChangesView(changes, links: links))
        }
        router.get("/api/v1/history/:jobId") { request, context in
            let (_, item) = try await ownedItem(request, context)
            return try JSONResponse.make(.ok, ItemView(item, links: links))
        }
        router.delete("/api/v1/history/:jobId") { request, context in
            let caller = try context.caller()
            let deleted = try await clients.call(.history, History.delete, HistoryItemReference(userId: caller.id, jobId: try context.parameters.require("jobId")))
            return try JSONResponse.make(.ok, Deleted(deletedItemId: deleted.jobId))
        }
        router.post("/api/v1/history/:jobId/rerun") { request, context in
            let (caller, item) = try await ownedItem(request, context)
            return try await creator.create(
                caller: caller, imageKey: item.originalImageKey, effect: item.effectId, parameters: item.parameters,
                prompt: item.prompt, idempotencyKey: request.headers[.idempotencyKey], network: request.headers[.clientNetwork]
            )
        }
        router.post("/api/v1/history/:jobId/share") { request, context in
            let caller = try context.caller()
            let grant = try await clients.call(.history, History.share, ShareItem(
                userId: caller.id, jobId: try context.parameters.require("jobId"), lifetimeSeconds: shareLifetime
            ))
            return try JSONResponse.make(.created, Shared(shareUrl: links.publicBaseURL + "/s/" + grant.token, expiresAt: grant.expiresAt))
        }
        router.delete("/api/v1/history/:jobId/share") { request, context in
            let caller = try context.caller()
            _ = try await clients.call(.history, History.unshare, HistoryItemReference(userId: caller.id, jobId: try context.parameters.require("jobId")))
            return Response(status: .noContent)
        }
    }

    /// The caller and the item named in the path, if it is theirs (404 otherwise).
    func ownedItem(_ request: Request, _ context: Context) async throws -> (caller: Caller, item: HistoryItem) {
        let caller = try context.caller()
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

    /// An item as the app's `HistoryItem` decodes it: `status` is one of the app's four values.
    struct ItemView: Encodable {
        var id: String
        var thumbnailUrl: String?
        var effectTitle: String
        var effectId: String
        var status: HistoryStatus
        var createdAt: Date
        var resultUrl: String?
        var originalImageKey: String
        var parameters: [String: Double]
        var prompt: String?
        var error: String?
        var progress: Double?
        /// Credits the edit used: its price once it completed (or while it runs); 0 when it
        /// failed or was cancelled (they were given back).
        var credits: Int

        init(_ item: HistoryItem, links: DownloadLinks) {
            let completed = item.status == .completed
            id = item.jobId
            thumbnailUrl = completed ? links.url(item.thumbnailKey) : nil
            effectTitle = item.effectTitle
            effectId = item.effectId
            status = HistoryStatus(item.status)
            createdAt = item.createdAt
            resultUrl = completed ? links.url(item.resultKey) : nil
            originalImageKey = item.originalImageKey
            parameters = item.parameters
            prompt = item.prompt
            error = item.status == .failed ? item.lastError : nil
            progress = status == .processing ? item.progress : nil
            credits = item.cost
        }
    }

    struct SectionView: Encodable {
        var month: String
        var title: String
        var items: [ItemView]
    }

    struct PageView: Encodable {
        var items: [ItemView]
        var totalCount: Int
        var hasMore: Bool
        var nextCursor: String?
        var sections: [SectionView]?

        init(_ page: HistoryPage, links: DownloadLinks) {
            items = page.items.map { ItemView($0, links: links) }
            totalCount = page.totalCount
            hasMore = page.hasMore
            nextCursor = page.nextCursor
            sections = page.sections?.map { section in
                SectionView(month: section.month, title: section.title, items: section.items.map { ItemView($0, links: links) })
            }
        }
    }

    struct ChangeView: Encodable {
        var op: HistoryChange.Operation
        var item: ItemView?
        var id: String?
    }

    struct ChangesView: Encodable {
        var changes: [ChangeView]
        var nextToken: String
        var hasMore: Bool

        init(_ changes: HistoryChanges, links: DownloadLinks) {
            self.changes = changes.changes.map { change in
                ChangeView(op: change.op, item: change.item.map { ItemView($0, links: links) }, id: change.id ?? change.item?.jobId)
            }
            nextToken = changes.nextToken
            hasMore = changes.hasMore
        }
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
