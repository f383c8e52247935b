import Foundation
import GRDB
import Storage
import Testing

@Suite("Stored dates", .timeLimit(.minutes(5)))
struct StoredDateTests {
    @Test func theTextIsGRDBsOwnForAnyDate() {
        var generator = SystemRandomNumberGenerator()
        var dates = [Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 1_795_000_000.999), Date(timeIntervalSince1970: -1.5)]
        for _ in 0..<50_000 {
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

@Suite("Background checkpoints", .timeLimit(.minutes(5)))
struct WALCheckpointerTests {
    @Test func theLogIsCopiedIntoTheDatabaseFileWithoutTheWriterDoingIt() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("wal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("test.sqlite").path
        let (pool, checkpointer) = try DurableDatabase.openWithBackgroundCheckpoints(path: path)
        // The writer's own checkpoint waits for a log far larger than this test writes
        try await pool.write { db in
            try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, body TEXT)")
            for index in 0..<2000 {
                try db.execute(sql: "INSERT INTO item (body) VALUES (?)", arguments: [String(repeating: "x", count: 200) + "\(index)"])
            }
        }
        let size = { (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0 }
        // Then the database file grows to hold the rows: the checkpointer copied the log in
        let deadline = ContinuousClock.now.advanced(by: .seconds(10))
        while size() < 400_000, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(size() >= 400_000, "the database file is \(size()) bytes")
        #expect(checkpointer.checkpoints > 0)
    }
}
