import Foundation
import GRDB
@testable import QuotaService
import Storage
import Testing

/// The writer of every store keeps its statement and savepoint journals in memory
/// (`DurableDatabase.keepWriterJournalsInMemory`): a transaction that runs each item in a
/// savepoint, as the jobs store's group commits do, opens no temporary file.
@Suite("Writer journals in memory", .timeLimit(.minutes(2)))
struct WriterJournalTests {
    /// SQLite's temporary files this process holds open (deleted at once, still open).
    static func temporaryFilesOpen() -> Int {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return fds.filter { fd in
            ((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")) ?? "").contains("etilqs_")
        }.count
    }

    /// Changes 200 rows of 1 KiB in three savepoints of one transaction, as a group commit runs
    /// its parts, each savepoint journaling some 60 pages (past SQLite's 64 KiB spill size); how
    /// many temporary files were open at the transaction's end.
    static func savepointBatch(inMemory: Bool) throws -> Int {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("journal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let pool = try DurableDatabase.open(path: folder.appendingPathComponent("test.sqlite").path)
        try pool.write { db in
            try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            for id in 0..<200 { try db.execute(sql: "INSERT INTO item (id, body) VALUES (?, zeroblob(1024))", arguments: [id]) }
        }
        if inMemory { try DurableDatabase.keepWriterJournalsInMemory(pool) }
        return try pool.write { db in
            for part in 0..<3 {
                try db.inSavepoint {
                    for id in 0..<200 where id % 3 == part {
                        try db.execute(sql: "UPDATE item SET body = randomblob(1024) WHERE id = ?", arguments: [id])
                    }
                    return .commit
                }
            }
            return temporaryFilesOpen()
        }
    }

    @Test func aBatchOfSavepointsOpensNoTemporaryFile() throws {
        // The default spills the journal to a file (so the check below can fail)
        #expect(try Self.savepointBatch(inMemory: false) > 0)
        // The writers' setting keeps it in memory
        #expect(try Self.savepointBatch(inMemory: true) == 0)
    }

    /// The quota store's writer is set so once its file is open.
    @Test func theQuotaStoresWriterKeepsItsJournalsInMemory() async throws {
        let (database, folder) = try temporaryDatabase()
        defer { try? FileManager.default.removeItem(at: folder) }
        #expect(try await database.writer.read { db in try Int.fetchOne(db, sql: "PRAGMA temp_store") } != 2, "readers keep the default")
        #expect(try await database.writer.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA temp_store") } == 2)
        await database.close()
    }
}
