import PostgresNIO

/// A row's cells read one after another, each as the concrete type its method names: for the
/// wide rows read many at a time (a history page: 50 rows of 18 columns). postgres-nio's
/// `row.decode((A, B, …).self)` goes through its variadic generic decoding, which the compiler
/// does not specialize: every cell is decoded through witness tables, with type metadata looked
/// up at run time. That was a third of the history service's CPU serving first pages on
/// PostgreSQL (perf). Here each method's decoding is specialized for its type.
public struct PostgresCells {
    private var cells: PostgresRow.Iterator
    private var index = 0

    public init(_ row: PostgresRow) {
        cells = row.makeIterator()
    }

    public mutating func string() throws -> String { try next().decode(String.self) }
    public mutating func optionalString() throws -> String? { try next().decode(String?.self) }
    public mutating func int64() throws -> Int64 { try next().decode(Int64.self) }
    public mutating func optionalInt64() throws -> Int64? { try next().decode(Int64?.self) }
    public mutating func int() throws -> Int { try next().decode(Int.self) }
    public mutating func double() throws -> Double { try next().decode(Double.self) }

    private mutating func next() throws -> PostgresCell {
        defer { index += 1 }
        guard let cell = cells.next() else { throw PostgresRowTooShort(column: index) }
        return cell
    }
}

/// A row with fewer columns than its reader reads: a statement and its reader out of step.
public struct PostgresRowTooShort: Error, CustomStringConvertible {
    public var column: Int
    public var description: String { "the row has no column \(column)" }
}
