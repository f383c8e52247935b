import Foundation
import HistoryCore
import Messages

/// What a page and the changes feed mean, whichever store answers them: the tokens they take and
/// mint, the filter a request asks for, and how a store's rows become the answer. Each store
/// (`HistoryDatabase`, `PostgresHistoryStore`) only fetches the rows.
enum HistoryReads {
    /// What a cursor is bound to besides the user: the filter and the search.
    static func scope(of request: ListHistory) -> String {
        Set(request.statuses.map(\.rawValue)).sorted().joined(separator: ",") + "|" + (request.query ?? "")
    }

    /// The position a page starts after, from its cursor; `history.invalid_cursor` for a cursor
    /// not issued for this user and query.
    static func cursor(of request: ListHistory, signer: TokenSigner) throws -> PageCursor? {
        try request.cursor.map { token in
            guard let cursor = PageCursor.open(token, with: signer, userId: request.userId, scope: scope(of: request)) else {
                throw BusError(History.ErrorCode.invalidCursor, "the cursor is not one of this query's")
            }
            return cursor
        }
    }

    /// How many items a page skips: its offset from the top; none after a cursor, which says
    /// where the page starts.
    static func offset(of request: ListHistory, after: PageCursor?) -> Int {
        after == nil ? request.offset : 0
    }

    /// The job statuses a request lists (empty: all of them).
    static func statuses(of request: ListHistory) -> [String] {
        let statuses = Array(Set(request.statuses.flatMap(\.jobStatuses).map(\.rawValue))).sorted()
        return statuses.count == JobStatus.allCases.count ? [] : statuses
    }

    /// The search of a request, nil when it has none.
    static func query(of request: ListHistory) -> String? {
        request.query.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The page from up to `limit + 1` items fetched newest first (one more tells whether there
    /// are more) and the count of the whole filtered set.
    static func page(_ fetched: [HistoryItem], total: Int, request: ListHistory, signer: TokenSigner) -> HistoryPage {
        let items = Array(fetched.prefix(request.limit))
        let hasMore = fetched.count > request.limit
        let next = hasMore ? items.last.map { nextCursor(createdAt: $0.createdAt.milliseconds, jobId: $0.jobId, request: request, signer: signer) } : nil
        return HistoryPage(
            items: items, totalCount: total, hasMore: hasMore, nextCursor: next,
            sections: request.groupByMonth ? MonthSections.group(items, timeZone: request.timeZone, locale: request.locale) : nil
        )
    }

    /// The cursor of the page after one whose last item is (`createdAt`, `jobId`), bound to the
    /// request's user and query.
    static func nextCursor(createdAt: Int64, jobId: String, request: ListHistory, signer: TokenSigner) -> String {
        PageCursor(createdAt: createdAt, jobId: jobId).seal(with: signer, userId: request.userId, scope: scope(of: request))
    }

    /// The sequence a changes request starts after (0 without a token); throws for a token not
    /// this user's.
    static func since(_ request: ChangesSince, signer: TokenSigner) throws -> Int64 {
        try request.token.map { token in
            guard let opened = ChangesToken.open(token, with: signer, userId: request.userId) else {
                throw BusError(History.ErrorCode.invalidCursor, "the changes token is not one of this user's")
            }
            return opened.sequence
        } ?? 0
    }

    /// The answer `history.token_expired` gives a token older than the deletions kept.
    static let tokenExpired = BusError(History.ErrorCode.tokenExpired, "deletions this old are no longer kept: list the history again")

    /// The feed's page from up to `limit + 1` changed items and `limit + 1` deletions after
    /// `since`, each with its sequence: merged oldest first.
    static func changes(
        upserts: [(sequence: Int64, item: HistoryItem)], deletions: [(sequence: Int64, jobId: String)], since: Int64, request: ChangesSince,
        signer: TokenSigner
    ) -> HistoryChanges {
        let merged = (upserts.map { ($0.sequence, HistoryChange(op: .upsert, item: $0.item)) } + deletions.map { ($0.sequence, HistoryChange(op: .delete, id: $0.jobId)) })
            .sorted { $0.0 < $1.0 }
        let page = merged.prefix(request.limit)
        let last = page.last?.0 ?? since
        return HistoryChanges(
            changes: page.map(\.1), nextToken: ChangesToken(sequence: last).seal(with: signer, userId: request.userId), hasMore: merged.count > request.limit
        )
    }

    /// An item's parameters from their stored JSON.
    static func parameters(_ json: String?) -> [String: Double] {
        // Most edits have none: no decoder for those.
        if json == nil || json == "{}" { return [:] }
        return json.flatMap { try? JSONDecoder().decode([String: Double].self, from: Data($0.utf8)) } ?? [:]
    }

    /// An item's parameters as stored: written directly, keys sorted (`JSONEncoder` was 4% of
    /// history's time applying jobs' events in `make bench-gateway`); `parameters(_:)` reads them.
    static func json(_ parameters: [String: Double]) -> String {
        if parameters.isEmpty { return "{}" }
        var out = JSONBytes(capacity: 64)
        out.numbers(parameters)
        return String(decoding: out.bytes, as: UTF8.self)
    }

    /// What an item costs the user as history shows it: nothing once failed or cancelled.
    static func cost(of job: JobRecord) -> Int {
        job.status == .failed || job.status == .cancelled ? 0 : job.credits
    }
}

extension Date {
    /// Milliseconds since 1970, as history stores instants.
    var milliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }

    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
