import Foundation
import Messages

/// The quota decision, free of storage: whether `cost` more units fit a plan's windows.
public enum QuotaRules {
    /// The most units one reservation may carry.
    public static let maxCost = 1000
    /// The longest user id and job id accepted.
    public static let maxIdLength = 256

    /// Whether `cost` fits given what is used; if not, which windows refuse and when a retry can
    /// succeed (when the last of them resets).
    public static func decide(
        plan: Plan, cost: Int, dailyUsed: Int, monthlyUsed: Int, day: CalendarWindow, month: CalendarWindow
    ) -> (admitted: Bool, violated: [String], retryAt: Date?) {
        var violated: [CalendarWindow] = []
        if let limit = plan.dailyLimit, dailyUsed + cost > limit { violated.append(day) }
        if let limit = plan.monthlyLimit, monthlyUsed + cost > limit { violated.append(month) }
        guard !violated.isEmpty else { return (true, [], nil) }
        return (false, violated.map(\.kind.rawValue), violated.map(\.end).max())
    }

    /// A window's state for a plan.
    public static func window(_ window: CalendarWindow, limit: Int?, used: Int) -> QuotaWindow {
        QuotaWindow(
            name: window.kind.rawValue,
            limit: limit,
            used: used,
            remaining: limit.map { max(0, $0 - used) },
            startsAt: window.start,
            resetsAt: window.end,
            nominalSeconds: window.kind.nominalSeconds
        )
    }

    /// Checks an id: 1 to `maxIdLength` bytes, no control characters.
    public static func validId(_ id: String) -> Bool {
        guard (1...maxIdLength).contains(id.utf8.count) else { return false }
        // Printable ASCII, as nearly every id is, needs no Unicode table.
        if id.utf8.allSatisfy({ (0x20..<0x7F).contains($0) }) { return true }
        return !id.unicodeScalars.contains { $0.properties.generalCategory == .control }
    }
}
