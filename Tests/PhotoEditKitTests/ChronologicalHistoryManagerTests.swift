import Foundation
import PhotoEditKit
import Testing

/// Everything the "Testing Strategy" of `../shared/seeds/002_5e134dcf7859e662.txt` lists.
@MainActor
@Suite("ChronologicalHistoryManager", .timeLimit(.minutes(5)))
struct ChronologicalHistoryManagerTests {
    struct Calculation: Codable, Sendable, Equatable {
        var expression: String
    }

    /// A disk whose read the test holds back, whose writes can be made to fail, and which
    /// records every command it gets.
    actor ScriptedDisk: HistoryDiskIO {
        typealias Entry = Calculation
        private(set) var stored: [HistoryEntry<Calculation>]
        private(set) var appends = 0
        private(set) var rewrites: [[HistoryEntry<Calculation>]] = []
        private var failingWrites: Int
        private var held: CheckedContinuation<Void, Never>?
        private var holdRead: Bool
        private(set) var readStarted = false

        init(stored: [HistoryEntry<Calculation>] = [], failingWrites: Int = 0, holdRead: Bool = false) {
            self.stored = stored
            self.failingWrites = failingWrites
            self.holdRead = holdRead
        }

        func read() async -> [HistoryEntry<Calculation>]? {
            readStarted = true
            if holdRead { await withCheckedContinuation { held = $0 } }
            return stored
        }

        func releaseRead() {
            holdRead = false
            held?.resume()
            held = nil
        }

        func append(_ entry: HistoryEntry<Calculation>) -> Bool {
            appends += 1
            if failingWrites > 0 { failingWrites -= 1; return false }
            stored.append(entry)
            return true
        }

        func rewrite(_ entries: [HistoryEntry<Calculation>]) -> Bool {
            rewrites.append(entries)
            if failingWrites > 0 { failingWrites -= 1; return false }
            stored = entries
            return true
        }
    }

    static func temporaryFile() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("history-\(UUID().uuidString).jsonl")
    }

    static func expressions(_ entries: [HistoryEntry<Calculation>]) -> [String] { entries.map(\.data.expression) }

    @Test func appendsSingleAndMultipleEntriesNewestFirst() async {
        let history = ChronologicalHistoryManager<Calculation>(disk: ScriptedDisk())
        await history.settled()
        history.append(Calculation(expression: "1+1"))
        #expect(Self.expressions(history.entries) == ["1+1"])
        history.append(Calculation(expression: "2*3"))
        history.append(Calculation(expression: "9/3"))
        #expect(Self.expressions(history.entries) == ["9/3", "2*3", "1+1"])
        #expect(history.entries.map(\.timestamp) == history.entries.map(\.timestamp).sorted(by: >))
    }

    @Test func deletesOneSeveralAndAll() async {
        let disk = ScriptedDisk()
        let history = ChronologicalHistoryManager<Calculation>(disk: disk)
        await history.settled()
        for expression in ["a", "b", "c", "d"] { history.append(Calculation(expression: expression)) }
        let ids = Dictionary(uniqueKeysWithValues: history.entries.map { ($0.data.expression, $0.id) })
        history.delete(ids: [ids["b"]!])
        #expect(Self.expressions(history.entries) == ["d", "c", "a"])
        history.delete(ids: [ids["a"]!, ids["d"]!])
        #expect(Self.expressions(history.entries) == ["c"])
        history.delete(ids: Set(history.entries.map(\.id)))
        #expect(history.entries.isEmpty)
        await history.settled()
        #expect(await disk.stored.isEmpty)
        #expect(await disk.rewrites.count == 3)
    }

    @Test func persistsAcrossInstancesAsJSONLines() async throws {
        let file = Self.temporaryFile()
        defer { try? FileManager.default.removeItem(at: file) }
        let first = ChronologicalHistoryManager<Calculation>(fileURL: file)
        await first.settled()
        for expression in ["x", "y", "z"] { first.append(Calculation(expression: expression)) }
        first.delete(ids: [first.entries[1].id])
        first.append(Calculation(expression: "w"))
        await first.settled()
        // One JSON object a line: id, a numeric timestamp, the payload
        let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 3)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(Set(object.keys) == ["id", "timestamp", "data"] && object["timestamp"] is Double)
        // A new instance reads the same history
        let second = ChronologicalHistoryManager<Calculation>(fileURL: file)
        await second.settled()
        #expect(Self.expressions(second.entries) == ["w", "z", "x"])
        #expect(second.entries.map(\.id) == first.entries.map(\.id))
    }

    @Test func anEmptyFileAndALineCutShortAreHandled() async throws {
        let file = Self.temporaryFile()
        defer { try? FileManager.default.removeItem(at: file) }
        try Data().write(to: file)
        let empty = ChronologicalHistoryManager<Calculation>(fileURL: file)
        await empty.settled()
        #expect(empty.entries.isEmpty)
        empty.append(Calculation(expression: "kept"))
        await empty.settled()
        // A crash left half a line at the end: the whole lines still load
        let handle = try FileHandle(forWritingTo: file)
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(#"{"id":"5E0B"#.utf8))
        try handle.close()
        let reopened = ChronologicalHistoryManager<Calculation>(fileURL: file)
        await reopened.settled()
        #expect(Self.expressions(reopened.entries) == ["kept"])
    }

    @Test func fileErrorsLeaveMemoryRight() async {
        // A file that cannot be written or read: a folder that does not exist
        let file = URL(fileURLWithPath: "/nonexistent-\(UUID().uuidString)/history.jsonl")
        let history = ChronologicalHistoryManager<Calculation>(fileURL: file)
        history.append(Calculation(expression: "1"))
        await history.settled()
        history.append(Calculation(expression: "2"))
        history.delete(ids: [history.entries[1].id])
        await history.settled()
        #expect(Self.expressions(history.entries) == ["2"])
    }

    @Test func aFailedWriteIsRepairedByTheNextOne() async {
        let disk = ScriptedDisk(failingWrites: 1)
        let history = ChronologicalHistoryManager<Calculation>(disk: disk)
        await history.settled()
        history.append(Calculation(expression: "lost on disk"))
        await history.settled()
        #expect(await disk.stored.isEmpty)
        #expect(Self.expressions(history.entries) == ["lost on disk"])
        // The next change rewrites the whole file, so it holds both
        history.append(Calculation(expression: "next"))
        await history.settled()
        #expect(Self.expressions(await disk.stored) == ["lost on disk", "next"])
        // And appends go back to being appends
        history.append(Calculation(expression: "third"))
        await history.settled()
        let rewrites = await disk.rewrites.count, stored = await disk.stored
        #expect(rewrites == 1 && Self.expressions(stored) == ["lost on disk", "next", "third"])
    }

    @Test func entriesAddedDuringASlowLoadComeFirstAndAreMergedWithOneRewrite() async throws {
        let old = [HistoryEntry(data: Calculation(expression: "old-1"), timestamp: Date(timeIntervalSince1970: 1)),
                   HistoryEntry(data: Calculation(expression: "old-2"), timestamp: Date(timeIntervalSince1970: 2))]
        let disk = ScriptedDisk(stored: old, holdRead: true)
        // Init returns at once, with nothing loaded yet
        let history = ChronologicalHistoryManager<Calculation>(disk: disk)
        #expect(history.entries.isEmpty)
        let deadline = ContinuousClock.now.advanced(by: .seconds(5))
        while !(await disk.readStarted), ContinuousClock.now < deadline { await Task.yield() }
        // Entries appended while the read is held back
        history.append(Calculation(expression: "new-1"))
        history.append(Calculation(expression: "new-2"))
        #expect(Self.expressions(history.entries) == ["new-2", "new-1"])
        await disk.releaseRead()
        await history.settled()
        // They come first (newest), the loaded ones after (older)
        #expect(Self.expressions(history.entries) == ["new-2", "new-1", "old-2", "old-1"])
        // And one rewrite persisted the merge, oldest first; nothing was appended on its own
        #expect(await disk.rewrites.count == 1)
        #expect(Self.expressions(await disk.stored) == ["old-1", "old-2", "new-1", "new-2"])
        #expect(await disk.appends == 0)
    }

    @Test func noRewriteWhenNothingWasAddedDuringTheLoad() async {
        let old = [HistoryEntry(data: Calculation(expression: "only"))]
        let disk = ScriptedDisk(stored: old, holdRead: true)
        let history = ChronologicalHistoryManager<Calculation>(disk: disk)
        let deadline = ContinuousClock.now.advanced(by: .seconds(5))
        while !(await disk.readStarted), ContinuousClock.now < deadline { await Task.yield() }
        await disk.releaseRead()
        await history.settled()
        #expect(Self.expressions(history.entries) == ["only"])
        let rewrites = await disk.rewrites, appends = await disk.appends
        #expect(rewrites.isEmpty && appends == 0)
    }
}
