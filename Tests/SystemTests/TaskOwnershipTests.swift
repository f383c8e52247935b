import Foundation
import Testing

/// Every task and thread has an owner that ends and awaits it: long-running work runs in a
/// service's `run()` or a task group. The unstructured tasks left (`Task {`, `Task.detached`,
/// `Task(executorPreference:)`) and every thread started (`IOThread`, `Thread`, a Dispatch queue)
/// are listed here, each with its owner; a new one fails this test until it is either made
/// structured or listed with its reason.
@Suite("Task ownership", .timeLimit(.minutes(5)))
struct TaskOwnershipTests {
    /// File (from the repository root), how many unstructured tasks it starts, and why each is owned.
    static let allowed: [String: (count: Int, reason: String)] = [
        "Services/jobs/Worker/Providers/ModelRunner.swift": (1, """
            a provider's cancel, detached from the cancelled job task so that it can run, and \
            awaited there
            """),
        "Clients/PhotoEditKit/PhotoEditClient.swift": (2, """
            the app's update streams: each task is cancelled by its stream's termination handler
            """),
        "Clients/PhotoEditKit/ChronologicalHistoryManager.swift": (2, """
            the app's history screen model: the load and the last write are held, replaced and \
            awaited by the model (a SwiftUI observable has no task scope of its own)
            """),
        "Shared/Storage/PostgresPool.swift": (3, """
            the pool's operations, out of reach of the run's cancellation (cancelling a lease that \
            waits in postgres-nio's pool can lose it): the run shuts that pool down, which fails \
            every wait, then awaits the task, for at most 5 s (an operation whose statement went \
            to a closed connection never ends, and is logged); that wait and its 5 s timer, each \
            awaited by the run (the timer cancelled first)
            """),
        "Shared/Bus/BusServer.swift": (1, """
            one per request, on the server's executor: counted in flight (at most \
            BUS_MAX_IN_FLIGHT), and a stop drains them (answered) before the socket closes
            """),
        "Tools/loadtest/LoadTest.swift": (6, """
            the load run's live line, chaos, fault, load and stopper tasks, each cancelled or awaited \
            before the run ends; the client's shutdown as the command returns
            """),
    ]

    /// File, how many threads it starts (`IOThread`, `Thread`, a Dispatch queue), and who owns
    /// each: who ends it and awaits its end.
    static let allowedThreads: [String: (count: Int, reason: String)] = [
        "Shared/Threads/BatchThread.swift": (1, """
            the group committer's and the quota ledger's batch thread: started with the first item, \
            it ends after a second idle; its owner (the store) calls `close()`, which lets it \
            answer what is queued and awaits its end (`ClosedAtShutdown` in each service's main)
            """),
        "Shared/Threads/BlockingThreads.swift": (1, """
            a store's read threads (`DatabaseReads`) and the worker's blocking pool (`BlockingPool`): \
            started when a call finds every running one busy, each ends after it idles (a second; a \
            minute in the worker); a store calls `close()`, which lets them run what is queued and \
            awaits their end (`ClosedAtShutdown` in each service's main); the worker's is owned by \
            its process, which has one
            """),
        "Shared/Storage/WALCheckpointer.swift": (1, """
            started by `WALCheckpointer.start` (not an init), ended and awaited by `close()`, \
            which its database's `close()` calls
            """),
        "Services/quota/Service/Storage/LedgerCheckpointer.swift": (1, """
            started by changes to write into the tables, it ends once the tables hold them all; \
            what it has not written is in the ledger's log, read again at the next start
            """),
        "Shared/Bus/BusClient.swift": (1, """
            the client's I/O loop, run by `IOThread.run` from the client's `run()`, which awaits it
            """),
        "Shared/Bus/BusServer.swift": (1, """
            the server's I/O loop, run by `IOThread.run` from the server's `run()`, which awaits it
            """),
        "Shared/Bus/BusChannel.swift": (1, """
            the channel's I/O loop, run by `IOThread.run` from the channel's `run()`, which awaits it
            """),
        "Shared/Bus/BusAuthentication.swift": (1, """
            the process's one ZAP handler, serving until the ZeroMQ context ends at exit \
            (`ZMQContext.terminate`), which ends its socket and so the thread
            """),
        "Shared/Threads/IOThread.swift": (1, "the one place a thread is made, for the uses listed here"),
        "Shared/ServiceKit/ProcessExit.swift": (1, """
            the parent watch (`EXIT_WITH_PARENT`): it ends the process, for the process's life
            """),
        "Shared/ZeroMQ/ZMQContext.swift": (1, """
            `zmq_ctx_term` at exit, awaited by `terminate(within:)` for at most its limit: past it \
            a socket is still open and the process ends with the thread
            """),
        "Tools/loadtest/Fault.swift": (1, """
            waits for a fault command's end (`waitpid`), run by `IOThread.run` from `shell`, which awaits it
            """),
    ]

    /// The threads each Swift file under `folders` starts.
    static func threads(in folders: [String]) throws -> [String: Int] {
        try count(#"\bIOThread\.(start|run)\(|\bThread\s*\{|Thread\.detachNewThread|DispatchQueue\.global|DispatchQueue\(label|\bpthread_create\("#, in: folders)
    }

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The unstructured tasks each Swift file under `folders` starts.
    static func unstructuredTasks(in folders: [String]) throws -> [String: Int] {
        try count(#"\bTask(\.detached)?\s*\{|\bTask\((priority|executorPreference)"#, in: folders)
    }

    /// The matches of `pattern` in each Swift file under `folders`, comment lines left out.
    static func count(_ expression: String, in folders: [String]) throws -> [String: Int] {
        let pattern = try NSRegularExpression(pattern: expression)
        var found: [String: Int] = [:]
        for folder in folders {
            let base = root.appendingPathComponent(folder)
            guard let files = FileManager.default.enumerator(at: base, includingPropertiesForKeys: nil) else { continue }
            for case let file as URL in files where file.pathExtension == "swift" && !file.path.contains("/Generated/") {
                let text = try String(contentsOf: file, encoding: .utf8)
                let code = text.split(separator: "\n", omittingEmptySubsequences: false)
                    .filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("//") }.joined(separator: "\n")
                let count = pattern.numberOfMatches(in: code, range: NSRange(code.startIndex..., in: code))
                if count > 0 { found[String(file.path.dropFirst(root.path.count + 1)), default: 0] += count }
            }
        }
        return found
    }

    /// What `found` finds in the code matches `allowed`, file by file.
    static func expectListed(_ found: [String: Int], _ allowed: [String: (count: Int, reason: String)], what: String) {
        for (file, count) in found.sorted(by: { $0.key < $1.key }) {
            #expect(allowed[file]?.count == count, "\(file) starts \(count) \(what); listed: \(allowed[file]?.count ?? 0)")
        }
        for file in allowed.keys where found[file] == nil {
            Issue.record("\(file) is listed but starts no \(what) any more: take it off the list")
        }
    }

    static let folders = ["Services", "Shared", "Clients", "Tools", "Benchmarks"]

    @Test func everyUnstructuredTaskIsListedWithItsOwner() throws {
        Self.expectListed(try Self.unstructuredTasks(in: Self.folders), Self.allowed, what: "unstructured task(s)")
    }

    @Test func everyThreadIsListedWithItsOwner() throws {
        Self.expectListed(try Self.threads(in: Self.folders), Self.allowedThreads, what: "thread(s)")
    }
}
