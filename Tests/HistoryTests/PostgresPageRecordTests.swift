@testable import HistoryService
import NIOCore
import Testing

/// A PostgreSQL page is one row whose second cell is the items' records back to back, each as
/// `record_send` writes it (`PostgresPageRecord.records(in:)`). The pages themselves are held to
/// the ones written from items on a real server (`HistoryRenderedPageTests`); these hold the
/// splitting to its bytes, and bytes that are not records to an error rather than a read past
/// the buffer.
@Suite("PostgreSQL page records")
struct PostgresPageRecordTests {
    /// A record as `record_send` writes it: the column count, then each column's type oid, length
    /// (-1 for NULL) and bytes. The bytes of `psql`'s `\copy (SELECT record_send(ROW(...)))`.
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

    static let first = record([(25, Array("job-1".utf8)), (20, [0, 0, 0, 0, 0, 0, 0, 7]), (25, nil)])
    static let second = record([(25, Array("job-2 ü".utf8)), (20, [0, 0, 0, 0, 0, 0, 0, 9]), (25, [])])

    @Test func recordsBackToBackAreSplitIntoEachRecordsBytes() throws {
        var bytes = ByteBuffer(bytes: Self.first + Self.second)
        let records = try PostgresPageRecord.records(in: &bytes)
        #expect(records.map { Array($0.readableBytesView) } == [Self.first, Self.second])
        var none = ByteBuffer()
        #expect(try PostgresPageRecord.records(in: &none).isEmpty)
    }

    @Test func bytesCutShortAnywhereOrWithALengthPastTheEndAreMalformed() throws {
        let whole = Self.first + Self.second
        for end in 1..<whole.count where end != Self.first.count {
            var bytes = ByteBuffer(bytes: whole[..<end])
            #expect(throws: PostgresPageMalformed.self, "cut at \(end)") { try PostgresPageRecord.records(in: &bytes) }
        }
        var tooLong = ByteBuffer(bytes: Self.record([(25, Array("job".utf8))]))
        tooLong.setInteger(Int32(1 << 30), at: 8)
        #expect(throws: PostgresPageMalformed.self) { try PostgresPageRecord.records(in: &tooLong) }
    }
}
