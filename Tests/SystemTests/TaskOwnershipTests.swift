import Foundation
import Testing

/// Every task has an owner that cancels and awaits it: long-running work runs in a service's
/// `run()` or a task group. The unstructured tasks left (`Task {`, `Task.detached`,
/// `Task(executorPreference:)`) are listed here, each with why it is owned anyway; a new one
/// fails this test until it is either made structured or listed with its reason.
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

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The unstructured tasks each Swift file under `folders` starts.
    static func unstructuredTasks(in folders: [String]) throws -> [String: Int] {
        let pattern = try NSRegularExpression(pattern: #"\bTask(\.detached)?\s*\{|\bTask\((priority|executorPreference)"#)
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

    @Test func everyUnstructuredTaskIsListedWithItsOwner() throws {
        let found = try Self.unstructuredTasks(in: ["Services", "Shared", "Clients", "Tools", "Benchmarks"])
        for (file, count) in found.sorted(by: { $0.key < $1.key }) {
            #expect(Self.allowed[file]?.count == count, "\(file) starts \(count) unstructured task(s); listed: \(Self.allowed[file]?.count ?? 0)")
        }
        for file in Self.allowed.keys where found[file] == nil {
            Issue.record("\(file) is listed but starts no unstructured task any more: take it off the list")
        }
    }
}
