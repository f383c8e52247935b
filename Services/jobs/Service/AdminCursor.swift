import Foundation
import Messages

/// Where a page of the operators' job list ends: the last job's creation time and id (jobs are
/// listed newest first, ties by id), carried as an opaque base64url string.
public struct AdminCursor: Sendable, Equatable {
    public var createdAt: Date
    public var id: String

    public init(createdAt: Date, id: String) {
        self.createdAt = createdAt
        self.id = id
    }

    /// The cursor after `job`.
    public init(after job: JobRecord) {
        self.init(createdAt: job.createdAt, id: job.id)
    }

    public var text: String {
        // The `Date` to the bit (its own reference-date seconds: from 1970 would round), in
        // Swift's shortest text that reads back as the same double.
        Base64URL.encode(Data("\(createdAt.timeIntervalSinceReferenceDate):\(id)".utf8))
    }

    /// A cursor from its text; nil if it is not one.
    public init?(text: String) {
        guard let data = Base64URL.decode(text), let string = String(data: data, encoding: .utf8), let colon = string.firstIndex(of: ":"),
              let seconds = Double(string[..<colon]), seconds.isFinite else { return nil }
        self.init(createdAt: Date(timeIntervalSinceReferenceDate: seconds), id: String(string[string.index(after: colon)...]))
    }

    /// `text` for a LIKE that finds it anywhere: its `%`, `_` and `\` taken literally (escaped by `\`).
    static func likePattern(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%").replacingOccurrences(of: "_", with: "\\_")
    }
}
