import Foundation

/// A calendar day or month in a time zone: exact bounds (a day may be 23 or 25 hours, a month 28
/// to 31 days) and a key naming it in that zone, such as `2026-11-21` or `2026-11`.
public struct CalendarWindow: Sendable, Equatable {
    public enum Kind: String, Sendable, CaseIterable {
        case daily, monthly

        /// The nominal length the `RateLimit-Policy` header names.
        public var nominalSeconds: Int {
            switch self {
            case .daily: 86_400
            case .monthly: 2_592_000
            }
        }
    }

    public var kind: Kind
    public var start: Date
    /// The first instant of the next window: when this one resets.
    public var end: Date
    public var key: String

    /// The window of `kind` that contains `instant` in `timeZone`.
    public init(_ kind: Kind, containing instant: Date, in timeZone: TimeZone) {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let component: Calendar.Component = kind == .daily ? .day : .month
        guard let interval = calendar.dateInterval(of: component, for: instant) else {
            preconditionFailure("the gregorian calendar has a \(component) for every instant")
        }
        let parts = calendar.dateComponents([.year, .month, .day], from: interval.start)
        let year = parts.year!, month = parts.month!, day = parts.day!
        self.kind = kind
        self.start = interval.start
        self.end = interval.end
        self.key = kind == .daily
            ? String(format: "%04d-%02d-%02d", year, month, day)
            : String(format: "%04d-%02d", year, month)
    }

    /// The time zone for an IANA identifier, UTC for nil; nil if the identifier is unknown.
    public static func timeZone(_ identifier: String?) -> TimeZone? {
        guard let identifier, !identifier.isEmpty else { return TimeZone(identifier: "UTC") }
        return TimeZone(identifier: identifier)
    }
}
