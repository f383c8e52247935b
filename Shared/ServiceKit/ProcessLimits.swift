#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Limits of the process itself.
public enum ProcessLimits {
    /// Raises the soft limit of open file descriptors to the hard limit (one per HTTP
    /// connection and event stream; the usual soft default of 1,024 is far below what a gateway
    /// holds), and returns the limit now in force.
    @discardableResult
    public static func raiseOpenFiles() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return -1 }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(clamping: limit.rlim_cur)
    }
}
