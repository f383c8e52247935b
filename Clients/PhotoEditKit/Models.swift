import Foundation
import OpenAPIRuntime
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What went wrong, typed from the gateway's problem+json.
public enum PhotoEditError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A window of the plan is used up: which ones, seconds until a retry can succeed, the plan.
    case quotaExceeded(windows: [String], retryAfter: Int, plan: String)
    case unauthorized
    case notFound
    /// The gateway cannot be reached.
    case offline
    /// The request was refused as it is (400, 409, 413, 415, 422 …), with the gateway's words.
    case badRequest(String)
    /// The server failed or is unavailable (5xx).
    case server(status: Int, detail: String?)

    init(status: Int, problem data: Data) {
        let problem = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        let detail = problem["detail"] as? String
        switch status {
        case 401: self = .unauthorized
        case 403 where problem["code"] == nil: self = .unauthorized
        case 404: self = .notFound
        case 429:
            self = .quotaExceeded(windows: problem["violated-policies"] as? [String] ?? [],
                                  retryAfter: problem["retryAfter"] as? Int ?? 0, plan: problem["plan"] as? String ?? "")
        case 400..<500: self = .badRequest(detail ?? "refused (\(status))")
        default: self = .server(status: status, detail: detail)
        }
    }

    init(_ error: any Error) {
        if let error = error as? PhotoEditError { self = error; return }
        if let error = error as? ClientError { self = PhotoEditError(error.underlyingError); return }
        if error is URLError || (error as NSError).domain == NSURLErrorDomain { self = .offline; return }
        self = .server(status: 0, detail: "\(error)")
    }

    /// Worth trying again as it is: the gateway was unreachable or unavailable.
    public var isTransient: Bool {
        switch self {
        case .offline: true
        case .server(let status, _): status == 503 || status == 504 || status == 0
        default: false
        }
    }

    public var description: String {
        switch self {
        case .quotaExceeded(let windows, let retryAfter, let plan):
            "the \(windows.joined(separator: " and ")) edit limit of the \(plan) plan is used up; it resets in \(Self.duration(retryAfter))"
        case .unauthorized: "not signed in, or the sign-in was refused"
        case .notFound: "not found"
        case .offline: "the gateway cannot be reached"
        case .badRequest(let detail): detail
        case .server(let status, let detail): "the server failed (\(status))\(detail.map { ": \($0)" } ?? "")"
        }
    }

    static func duration(_ seconds: Int) -> String {
        seconds >= 3600 ? "\(seconds / 3600) h \(seconds % 3600 / 60) min" : seconds >= 60 ? "\(seconds / 60) min" : "\(seconds) s"
    }
}

/// The caller, as `users/me` says.
public struct Me: Sendable, Equatable {
    public var id: String
    public var email: String?
    public var isGuest: Bool
    public var isPro: Bool
    public var plan: String
    public var planEndsAt: Date?
    public var quota: Quota

    /// The Chat screen's badge: "X Free Edits Left", none for PRO.
    public var quotaBadge: String? {
        guard !isPro else { return nil }
        let left = quota.remaining
        return "\(left) Free Edit\(left == 1 ? "" : "s") Left"
    }
}

/// The caller's quota windows; a nil limit is one the plan does not have.
public struct Quota: Sendable, Equatable {
    public var dailyRemaining: Int?
    public var dailyLimit: Int?
    public var dailyUsed: Int
    public var monthlyRemaining: Int?
    public var monthlyLimit: Int?
    public var monthlyUsed: Int
    public var dailyResetsAt: Date
    public var monthlyResetsAt: Date

    /// Edits left now: the smaller of the windows that have a limit.
    public var remaining: Int { [dailyRemaining, monthlyRemaining].compactMap { $0 }.min() ?? .max }

    init(_ badge: Components.Schemas.QuotaBadge) {
        dailyRemaining = badge.dailyRemaining
        dailyLimit = badge.dailyLimit
        dailyUsed = badge.dailyUsed
        monthlyRemaining = badge.monthlyRemaining
        monthlyLimit = badge.monthlyLimit
        monthlyUsed = badge.monthlyUsed
        dailyResetsAt = badge.dailyResetsAt
        monthlyResetsAt = badge.monthlyResetsAt
    }
}

/// An effect of the catalogue.
public struct Effect: Sendable, Equatable {
    public struct Parameter: Sendable, Equatable {
        public var name: String
        public var minimum: Double
        public var maximum: Double
        public var defaultValue: Double
    }
    public var id: String
    public var title: String
    /// What one edit costs, in credits.
    public var credits: Int
    /// `image` or `video`.
    public var kind: String
    public var parameters: [Parameter]
}

/// A job just created.
public struct JobTicket: Sendable, Equatable {
    public var jobId: String
    public var status: String
    public var createdAt: Date
}

/// A job's state.
public struct JobUpdate: Sendable, Equatable {
    public var jobId: String
    public var status: String
    public var progress: Double
    public var resultUrl: String?
    public var thumbnailUrl: String?
    public var error: String?

    public var isFinished: Bool { ["completed", "failed", "cancelled"].contains(status) }

    init(_ view: Components.Schemas.JobStatusView) {
        jobId = view.jobId
        status = view.status.rawValue
        progress = view.progress
        resultUrl = view.resultUrl
        thumbnailUrl = view.thumbnailUrl
        error = view.error
    }
}

/// One past edit.
public struct HistoryItem: Codable, Sendable, Equatable, Identifiable {
    public var id: String
    public var thumbnailUrl: String?
    public var effectTitle: String
    public var effectId: String
    public var status: String
    public var createdAt: Date
    public var resultUrl: String?
    public var originalImageKey: String
    public var parameters: [String: Double]
    public var prompt: String?
    public var error: String?

    public init(id: String, thumbnailUrl: String? = nil, effectTitle: String, effectId: String, status: String, createdAt: Date,
                resultUrl: String? = nil, originalImageKey: String, parameters: [String: Double] = [:], prompt: String? = nil, error: String? = nil) {
        self.id = id
        self.thumbnailUrl = thumbnailUrl
        self.effectTitle = effectTitle
        self.effectId = effectId
        self.status = status
        self.createdAt = createdAt
        self.resultUrl = resultUrl
        self.originalImageKey = originalImageKey
        self.parameters = parameters
        self.prompt = prompt
        self.error = error
    }

    init(_ item: Components.Schemas.HistoryItem) {
        self.init(id: item.id, thumbnailUrl: item.thumbnailUrl, effectTitle: item.effectTitle, effectId: item.effectId,
                  status: item.status.rawValue, createdAt: item.createdAt, resultUrl: item.resultUrl, originalImageKey: item.originalImageKey,
                  parameters: item.parameters.additionalProperties, prompt: item.prompt, error: item.error)
    }
}

/// A page of history.
public struct HistoryPage: Sendable, Equatable {
    public var items: [HistoryItem]
    public var totalCount: Int
    public var hasMore: Bool
    public var nextCursor: String?
}

/// Changes of the history since a token.
public struct HistoryChanges: Sendable, Equatable {
    public enum Change: Sendable, Equatable {
        case upsert(HistoryItem)
        case delete(String)
    }
    public var changes: [Change]
    public var nextToken: String
    public var hasMore: Bool
}

/// A public link to a result.
public struct ShareLink: Sendable, Equatable {
    public var url: String
    public var expiresAt: Date
}
