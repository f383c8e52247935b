import Foundation
import JobsCore
import Messages
import Testing

@Suite("The last hour's outcomes")
struct RecentOutcomesTests {
    @Test func eachMinuteCountsItsOwnAndAMinuteAnHourOldIsForgotten() {
        var outcomes = RecentOutcomes()
        let start = Date(timeIntervalSince1970: 1_800_000_000)  // a whole minute
        outcomes.record(.completed, at: start)
        outcomes.record(.completed, at: start.addingTimeInterval(59))
        outcomes.record(.failed, at: start.addingTimeInterval(60))
        outcomes.record(.cancelled, at: start.addingTimeInterval(60))
        let hour = outcomes.lastHour(at: start.addingTimeInterval(61))
        #expect(hour.count == 60)
        #expect(hour.suffix(2) == [OutcomeMinute(minute: 30_000_000, completed: 2), OutcomeMinute(minute: 30_000_001, failed: 1)])
        #expect(hour.dropLast(2).allSatisfy { $0.completed == 0 && $0.failed == 0 })
        // An hour on, the same slot of the ring holds the new minute only
        outcomes.record(.failed, at: start.addingTimeInterval(3600))
        let later = outcomes.lastHour(at: start.addingTimeInterval(3600))
        #expect(later.last == OutcomeMinute(minute: 30_000_060, failed: 1))
        #expect(later.first == OutcomeMinute(minute: 30_000_001, failed: 1))
    }
}
