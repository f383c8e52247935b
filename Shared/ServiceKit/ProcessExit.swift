#if canImport(Glibc)
import Glibc
#endif

/// Runs a process's main body; an error that reaches the top (a bad configuration, an endpoint
/// that cannot be bound) is printed as one line and the process exits with status 1, instead of
/// crashing with a backtrace.
public enum ProcessExit {
    public static func run(_ name: String, _ body: () async throws -> Void) async {
        do {
            try await body()
        } catch {
            print("\(name): fatal: \(error)")
            exit(1)
        }
    }
}
