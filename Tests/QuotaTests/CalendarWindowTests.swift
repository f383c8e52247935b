import Foundation
import QuotaCore
import Testing

@Suite("Calendar windows", .timeLimit(.minutes(5)))
struct CalendarWindowTests {
    let utc = TimeZone(identifier: "UTC")!
    let newYork = TimeZone(identifier: "America/New_York")!
    let berlin = TimeZone(identifier: "Europe/Berlin")!

    func instant(_ text: String) -> Date {
        try! Date(text, strategy: .iso8601)
    }

    @Test func endOfJanuaryRollsIntoAThirtyOneDayJanuaryAndATwentyEightDayFebruary() {
        let lastMinuteOfJanuary = CalendarWindow(.monthly, containing: instant("2027-01-31T23:59:59Z"), in: utc)
        #expect(lastMinuteOfJanuary.key == "2027-01")
        #expect(lastMinuteOfJanuary.start == instant("2027-01-01T00:00:00Z"))
        #expect(lastMinuteOfJanuary.end == instant("2027-02-01T00:00:00Z"))
        let february = CalendarWindow(.monthly, containing: instant("2027-02-01T00:00:00Z"), in: utc)
        #expect(february.key == "2027-02")
        #expect(february.end == instant("2027-03-01T00:00:00Z"))
        #expect(february.end.timeIntervalSince(february.start) == 28 * 86_400)
    }

    @Test func leapYearFebruaryHasTwentyNineDaysAndItsOwnTwentyNinth() {
        let leapDay = CalendarWindow(.daily, containing: instant("2028-02-29T12:00:00Z"), in: utc)
        #expect(leapDay.key == "2028-02-29")
        #expect(leapDay.end == instant("2028-03-01T00:00:00Z"))
        let february = CalendarWindow(.monthly, containing: instant("2028-02-29T12:00:00Z"), in: utc)
        #expect(february.end.timeIntervalSince(february.start) == 29 * 86_400)
    }

    @Test func newYorkSpringForwardDayHasTwentyThreeHours() {
        // 2027-03-14: clocks go from 02:00 EST to 03:00 EDT.
        let day = CalendarWindow(.daily, containing: instant("2027-03-14T12:00:00Z"), in: newYork)
        #expect(day.key == "2027-03-14")
        #expect(day.start == instant("2027-03-14T05:00:00Z"))
        #expect(day.end == instant("2027-03-15T04:00:00Z"))
        #expect(day.end.timeIntervalSince(day.start) == 23 * 3600)
    }

    @Test func newYorkFallBackDayHasTwentyFiveHours() {
        // 2027-11-07: clocks go from 02:00 EDT back to 01:00 EST.
        let day = CalendarWindow(.daily, containing: instant("2027-11-07T12:00:00Z"), in: newYork)
        #expect(day.start == instant("2027-11-07T04:00:00Z"))
        #expect(day.end == instant("2027-11-08T05:00:00Z"))
        #expect(day.end.timeIntervalSince(day.start) == 25 * 3600)
    }

    @Test func berlinDaylightSavingDaysAreTwentyThreeAndTwentyFiveHours() {
        // 2027-03-28 02:00 CET -> 03:00 CEST; 2027-10-31 03:00 CEST -> 02:00 CET.
        let spring = CalendarWindow(.daily, containing: instant("2027-03-28T10:00:00Z"), in: berlin)
        #expect(spring.start == instant("2027-03-27T23:00:00Z"))
        #expect(spring.end == instant("2027-03-28T22:00:00Z"))
        #expect(spring.end.timeIntervalSince(spring.start) == 23 * 3600)
        let autumn = CalendarWindow(.daily, containing: instant("2027-10-31T10:00:00Z"), in: berlin)
        #expect(autumn.start == instant("2027-10-30T22:00:00Z"))
        #expect(autumn.end == instant("2027-10-31T23:00:00Z"))
        #expect(autumn.end.timeIntervalSince(autumn.start) == 25 * 3600)
    }

    @Test func monthsResetAtLocalMidnightInTheUsersZone() {
        // 2027-03-31 23:30 in New York is already April in UTC, still March there.
        let march = CalendarWindow(.monthly, containing: instant("2027-04-01T03:30:00Z"), in: newYork)
        #expect(march.key == "2027-03")
        #expect(march.end == instant("2027-04-01T04:00:00Z"))
        // October in Berlin spans the autumn change: 31 days less... plus one hour.
        let october = CalendarWindow(.monthly, containing: instant("2027-10-15T00:00:00Z"), in: berlin)
        #expect(october.start == instant("2027-09-30T22:00:00Z"))
        #expect(october.end == instant("2027-10-31T23:00:00Z"))
        #expect(october.end.timeIntervalSince(october.start) == 31 * 86_400 + 3600)
    }

    @Test func unknownZonesAreRejectedAndNilIsUTC() {
        #expect(CalendarWindow.timeZone("Mars/Olympus_Mons") == nil)
        #expect(CalendarWindow.timeZone(nil) == TimeZone(identifier: "UTC"))
        #expect(CalendarWindow.timeZone("Europe/Berlin") == berlin)
    }
}
