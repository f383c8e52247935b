import Foundation
import Messages

/// How many jobs ended each minute of the last hour, completed and failed, for the operators'
/// console: a ring of 60 minutes, kept by the dispatcher in memory (a restart, or a new leader,
/// starts it afresh).
public struct RecentOutcomes: Sendable, Equatable {
    public static let minutes = 60

    public typealias Minute = OutcomeMinute

    private var ring = [Minute](repeating: Minute(minute: -1), count: RecentOutcomes.minutes)

    public init() {}

    static func minute(of date: Date) -> Int { Int((date.timeIntervalSince1970 / 60).rounded(.down)) }

    /// A job ended at `date` in `status` (a cancel is neither: it is the user's).
    public mutating func record(_ status: JobStatus, at date: Date) {
        guard status == .completed || status == .failed else { return }
        let minute = Self.minute(of: date)
        let slot = ((minute % Self.minutes) + Self.minutes) % Self.minutes
        if ring[slot].minute != minute { ring[slot] = Minute(minute: minute) }
        if status == .completed { ring[slot].completed += 1 } else { ring[slot].failed += 1 }
    }

    /// The 60 minutes up to and including `now`'s, oldest first, with zeros where none ended.
    public func lastHour(at now: Date) -> [Minute] {
        let current = Self.minute(of: now)
        return (current - Self.minutes + 1...current).map { minute in
            let slot = ((minute % Self.minutes) + Self.minutes) % Self.minutes
            return ring[slot].minute == minute ? ring[slot] : Minute(minute: minute)
        }
    }
}
