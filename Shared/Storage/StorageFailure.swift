import Bus
import GRDB
import PostgresNIO
import Messages

/// What a failed SQLite or PostgreSQL write means to a caller: a full disk (`storage_full`),
/// another storage fault that may pass (`storage_unavailable`: I/O error, busy or locked file, a
/// file that cannot be opened; PostgreSQL's connection lost or too slow, the server shutting down
/// or out of resources, a deadlock or serialization failure), PostgreSQL not reachable at all
/// (`unavailable`: no connection, nothing done), or nothing storage-related (nil). Nothing is
/// half-written; but when a PostgreSQL connection fails mid-way a commit may have happened, so a
/// caller must take `storage_unavailable` as an unknown outcome. The gateway answers 503.
public enum StorageFailure {
    /// `busError(for:)` for a bus router.
    public static let translator = BusErrorTranslator(busError(for:))

    public static func busError(for error: any Error) -> BusError? {
        // No connection was had: nothing was done, a definite failure.
        if error is PostgresUnavailable { return BusError(.unavailable, "the service's database cannot be reached now") }
        // Abandoned mid-way: a write may or may not have committed.
        if error is PostgresOperationTimedOut { return BusError(.storageUnavailable, "the service's database did not answer in time") }
        if let error = error as? PSQLError { return busError(for: error) }
        guard let error = error as? DatabaseError else { return nil }
        switch error.resultCode {
        case .SQLITE_FULL:
            return BusError(.storageFull, "the service's disk is full")
        case .SQLITE_IOERR, .SQLITE_BUSY, .SQLITE_LOCKED, .SQLITE_CANTOPEN, .SQLITE_READONLY, .SQLITE_PROTOCOL:
            return BusError(.storageUnavailable, "the service's storage failed: \(error.resultCode)")
        default:
            return nil
        }
    }

    static func busError(for error: PSQLError) -> BusError? {
        if PostgresUnavailable.isConnectionLevel(error) || error.code == .queryCancelled {
            return BusError(.storageUnavailable, "the service's database connection failed")
        }
        guard error.code == .server, let state = error.serverInfo?[.sqlState] else { return nil }
        if state == "53100" { return BusError(.storageFull, "the service's database disk is full") }
        // Connection exceptions, insufficient resources, operator intervention (a shutdown),
        // system errors, and transaction rollbacks (deadlocks, serialization failures).
        if ["08", "53", "57", "58", "40"].contains(String(state.prefix(2))) {
            return BusError(.storageUnavailable, "the service's database failed (SQLSTATE \(state))")
        }
        return nil
    }
}
