import HistoryCore
@testable import HistoryService
import Messages
import NIOCore
import Testing

/// A PostgreSQL page is one row whose second cell is the items' records back to back, each as
/// `record_send` writes it (`PostgresPageRecord.aggregate`, read by `PostgresPageRecord.append`).
/// The pages themselves are held to the ones written from items on a real server
/// (`HistoryRenderedPageTests`); these hold the reading to the bytes, and bytes that are not such
/// records to an error rather than a read past the buffer.
@Suite("PostgreSQL page records")
struct PostgresPageRecordTests {
    /// A record as `record_send` writes it: the column count, then each column's type oid, length
    /// (-1 for NULL) and bytes (as `psql`'s `\copy (SELECT record_send(ROW(...)))` shows them).
    static func record(_ columns: [(type: UInt32, bytes: [UInt8]?)]) -> [UInt8] {
        var buffer = ByteBuffer()
        buffer.writeInteger(Int32(columns.count))
        for column in columns {
            buffer.writeInteger(column.type)
            if let bytes = column.bytes {
                buffer.writeInteger(Int32(bytes.count))
                buffer.writeBytes(bytes)
            } else {
                buffer.writeInteger(Int32(-1))
            }
        }
        return Array(buffer.readableBytesView)
    }

    /// A completed item's record, in `PostgresPageRecord.columns`' order: text 25, bigint 20,
    /// double precision 701.
    static func item(_ jobId: String, createdAt: Int64) -> [UInt8] {
        func text(_ value: String) -> (UInt32, [UInt8]?) { (25, Array(value.utf8)) }
        func bigint(_ value: Int64) -> (UInt32, [UInt8]?) { (20, withUnsafeBytes(of: value.bigEndian) { Array($0) }) }
        return record([
            text(jobId), text("blur"), text("Soft Focus"), text("a sunset ü"), text("completed"),
            (701, withUnsafeBytes(of: (1.0 as Double).bitPattern.bigEndian) { Array($0) }), bigint(createdAt),
            text("results/\(jobId).jpg"), text("thumbs/\(jobId).jpg"), text("uploads/\(jobId).jpg"), text("{}"), bigint(1), (25, nil),
        ])
    }

    static let first = item("job-2", createdAt: 1_764_000_002_000)
    static let second = item("job-1", createdAt: 1_764_000_001_000)

    static func page(_ bytes: [UInt8]) throws -> RenderedHistoryPage {
        var written = WrittenPage(limit: 10)
        try PostgresPageRecord.append(ByteBuffer(bytes: bytes), to: &written)
        return written.page(total: 2, request: ListHistory(userId: "alice", limit: 10), signer: TokenSigner(key: Array(repeating: 7, count: 32)))
    }

    @Test func recordsBackToBackAreEachAnItemInTheirOrder() throws {
        let page = try Self.page(Self.first + Self.second)
        #expect(page.headEnds.count == 2)
        #expect(page.resultKeys == ["results/job-2.jpg", "results/job-1.jpg"])
        let ids = page.headText.components(separatedBy: "\"id\":").dropFirst().map { $0.prefix(7) }
        #expect(ids == ["\"job-2\"", "\"job-1\""])
        #expect(try Self.page([]).headEnds.isEmpty)
    }

    @Test func bytesCutShortAnywhereOrWithALengthPastTheEndOrOfAnotherShapeAreMalformed() throws {
        let whole = Self.first + Self.second
        for end in 1..<whole.count where end != Self.first.count {
            #expect(throws: PostgresPageMalformed.self, "cut at \(end)") { try Self.page(Array(whole[..<end])) }
        }
        var tooLong = Self.first
        tooLong.replaceSubrange(8..<12, with: [0x40, 0, 0, 0])
        #expect(throws: PostgresPageMalformed.self) { try Self.page(tooLong) }
        #expect(throws: PostgresPageMalformed.self) { try Self.page(Self.record([(25, Array("job".utf8))])) }
    }
}
