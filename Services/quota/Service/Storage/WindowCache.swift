import Foundation
import QuotaCore
import Synchronization

/// Remembers each time zone's current day and month windows, so the calendar arithmetic runs once
/// a window per zone rather than once a request.
final class WindowCache: Sendable {
    private let cache = Mutex<[String: (day: CalendarWindow, month: CalendarWindow)]>([:])
    /// Zones remembered at most; past it the cache starts over.
    private let capacity = 1024

    /// The day and month containing `instant` in `timeZone` (nil or unknown: UTC).
    func windows(containing instant: Date, timeZone identifier: String?) -> (day: CalendarWindow, month: CalendarWindow) {
        let key = identifier ?? ""
        if let hit = cache.withLock({ $0[key] }), hit.day.start <= instant, instant < hit.day.end,
           hit.month.start <= instant, instant < hit.month.end {
            return hit
        }
        let zone = CalendarWindow.timeZone(identifier) ?? TimeZone(identifier: "UTC")!
        let fresh = (CalendarWindow(.daily, containing: instant, in: zone), CalendarWindow(.monthly, containing: instant, in: zone))
        cache.withLock { cache in
            if cache.count >= capacity { cache.removeAll() }
            // Keep the window of the latest instant asked about.
            if let current = cache[key], current.day.start > fresh.0.start { return }
            cache[key] = fresh
        }
        return fresh
    }
}
