import Foundation
import GRDB
import Storage
import Testing

@Suite("Stored dates")
struct StoredDateTests {
    @Test func theTextIsGRDBsOwnForAnyDate() {
        var generator = SystemRandomNumberGenerator()
        var dates = [Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 1_795_000_000.999), Date(timeIntervalSince1970: -1.5)]
        for _ in 0..<2000 {
            dates.append(Date(timeIntervalSince1970: Double.random(in: -2_000_000_000...4_000_000_000, using: &generator)))
        }
        for date in dates {
            #expect(StoredDate.text(date) == String.fromDatabaseValue(date.databaseValue), "\(date.timeIntervalSince1970)")
        }
    }

    @Test func readsBackAsTheSameMillisecond() throws {
        let date = Date(timeIntervalSince1970: 1_795_000_123.456)
        let read = try #require(Date.fromDatabaseValue(StoredDate.text(date).databaseValue))
        #expect(abs(read.timeIntervalSince1970 - date.timeIntervalSince1970) < 0.001)
    }
}
