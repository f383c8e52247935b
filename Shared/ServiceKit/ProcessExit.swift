import Bus
import Foundation
#if canImport(Glibc)
import Glibc
import Threads
#endif

/// Runs a process's main body; an error that reaches the top (a bad configuration, an endpoint
/// that cannot be bound) is printed as one line and the process exits with status 1, instead of
/// crashing with a backtrace.
///
/// With `EXIT_WITH_PARENT` set to the process id of the process that starts it, the process also
/// stops when that one dies (or is not its parent to begin with): it sends itself SIGTERM, for the
/// usual graceful stop, and exits at once if it is still running 10 s later. The test harness sets
/// it, so that a test run that crashes leaves no service running behind it.
public enum ProcessExit {
    /// `files`: what `Environment.loadFiles()` gave, called by the main before this (its
    /// failure is reported as the body's would be).
    public static func run(_ name: String, files: Result<Void, ConfigurationError>, _ body: () async throws -> Void) async {
        if let parent = ProcessInfo.processInfo.environment["EXIT_WITH_PARENT"].flatMap(Int32.init) { watch(parent: parent) }
        do {
            try files.get()
            try await body()
        } catch {
            print("\(name): fatal: \(error)")
            exit(1)
        }
    }

    /// Looks twice a second (on a thread of its own) whether `parent` is still this process's.
    static func watch(parent: Int32) {
        IOThread.start(name: "parent-watch") {
            while getppid() == parent { Thread.sleep(forTimeInterval: 0.5) }
            kill(getpid(), SIGTERM)
            Thread.sleep(forTimeInterval: 10)
            _exit(1)
        }
    }
}
