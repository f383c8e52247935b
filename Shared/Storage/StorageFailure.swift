import Bus
import GRDB
import Messages

/// What a failed SQLite write means to a caller: a full disk (`storage_full`), another storage
/// fault that may pass (`storage_unavailable`: I/O error, busy or locked file, a file that cannot
/// be opened), or nothing storage-related (nil). Either way the transaction was rolled back, so
/// nothing was half-written; the bus answers the caller with the typed error.
public enum StorageFailure {
    /// `busError(for:)` for a bus router.
    public static let translator = BusErrorTranslator(busError(for:))

    public static func busError(for error: any Error) -> BusError? {
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
}
