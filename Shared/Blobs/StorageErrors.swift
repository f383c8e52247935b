import Foundation

/// Tells, from an error thrown by file I/O (Foundation, SwiftNIO's file system, libvips' error
/// text), whether the disk was full: the one storage fault a caller should wait out rather than
/// count as a failure of its own.
public enum StorageErrors {
    /// Whether `error` says the file system (or the user's disk quota) has no space left.
    public static func isOutOfSpace(_ error: any Error) -> Bool {
        if let posix = error as? POSIXError, posix.code == .ENOSPC || posix.code == .EDQUOT { return true }
        let nsError = error as NSError
        if nsError.domain == NSCocoaErrorDomain, nsError.code == CocoaError.fileWriteOutOfSpace.rawValue { return true }
        if nsError.domain == NSPOSIXErrorDomain, nsError.code == Int(ENOSPC) || nsError.code == Int(EDQUOT) { return true }
        if let underlying = nsError.userInfo[NSUnderlyingErrorKey] as? any Error, isOutOfSpace(underlying) { return true }
        // SwiftNIO's file system errors and libvips report the errno in their text only.
        return mentionsOutOfSpace("\(error)") || mentionsOutOfSpace(String(reflecting: error))
    }

    /// Whether an error message names a full disk.
    public static func mentionsOutOfSpace(_ text: String) -> Bool {
        text.contains("No space left on device") || text.contains("Disk quota exceeded") || text.contains("ENOSPC")
    }
}
