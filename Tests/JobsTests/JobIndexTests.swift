import Foundation
import GRDB
@testable import JobsService
import Testing

/// The job table's indexes: each question the store asks of an image is answered from one index,
/// and no index is kept that another one already serves (each costs a write per creation).
@Suite("Job indexes", .timeLimit(.minutes(2)))
struct JobIndexTests {
    @Test func bothQuestionsAskedOfAnImageUseTheOneIndexByImage() throws {
        let queue = try DatabaseQueue()
        try JobsDatabase.migrator.migrate(queue)
        try queue.read { db in
            let indexes = try db.indexes(on: "job").map(\.name)
            #expect(indexes.contains("job_by_image_key"))
            #expect(!indexes.contains("job_by_image"), "(userId, imageKey) is served by (imageKey, userId)")
            #expect(try db.indexes(on: "job").first { $0.name == "job_by_image_key" }?.columns == ["imageKey", "userId"])
            // Does this user's other job use the image (a purge keeps a shared original); does
            // any job use it (the unused-upload sweep)?
            for sql in [
                "SELECT COUNT(*) FROM job WHERE userId = 'u' AND imageKey = 'uploads/u/a.jpg'",
                "SELECT imageKey FROM job WHERE imageKey IN ('uploads/u/a.jpg', 'uploads/u/b.jpg')",
            ] {
                let plan = try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql).map { $0["detail"] as String }.joined(separator: "; ")
                #expect(plan.contains("USING COVERING INDEX job_by_image_key") || plan.contains("USING INDEX job_by_image_key"), "\(sql): \(plan)")
            }
        }
    }

    /// Its writer keeps statement and savepoint journals in memory (`WriterJournalTests`).
    @Test func theWriterKeepsItsJournalsInMemory() async throws {
        let database = try JobsDatabase(try DatabaseQueue())
        #expect(try await database.write { db in try Int.fetchOne(db, sql: "PRAGMA temp_store") } == 2)
        await database.close()
    }
}
