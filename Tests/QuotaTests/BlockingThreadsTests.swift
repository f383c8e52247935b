import Bus
import Dispatch
import Foundation
import GRDB
import Messages
import Storage
import Synchronization
import Testing
import TestSupport
import Threads

@Suite("Blocking threads", .timeLimit(.minutes(2)))
struct BlockingThreadsTests {
    /// The calls running at once now, and the most seen.
    final class Inside: Sendable {
        let now = Atomic<Int>(0)
        let most = Atomic<Int>(0)
    }

    @Test func callsRunOnAtMostTheirThreadsAndEveryOneIsAnswered() async throws {
        let threads = BlockingThreads(name: "test-read", threads: 2, maxQueued: 16)
        let gate = DispatchSemaphore(value: 0)
        let calls = Inside()
        try await withThrowingTaskGroup(of: Int.self) { group in
            for value in 0..<6 {
                group.addTask {
                    try await threads.run {
                        let now = calls.now.add(1, ordering: .relaxed).newValue
                        calls.most.max(now, ordering: .relaxed)
                        gate.wait()
                        calls.now.subtract(1, ordering: .relaxed)
                        return value
                    }
                }
            }
            // Two calls run, each on a thread of its own; the other four wait in the queue.
            try await waitUntil { calls.now.load(ordering: .relaxed) == 2 }
            #expect(threads.running == 2)
            for _ in 0..<6 { gate.signal() }
            var answered: [Int] = []
            for try await value in group { answered.append(value) }
            #expect(answered.sorted() == Array(0..<6))
        }
        #expect(calls.most.load(ordering: .relaxed) == 2)
        await threads.close()
        #expect(threads.running == 0)
    }

    @Test func pastMaxQueuedACallIsRefusedAndIdleThreadsEnd() async throws {
        let threads = BlockingThreads(name: "test-read", threads: 1, maxQueued: 2, idleTimeout: .milliseconds(50))
        let gate = DispatchSemaphore(value: 0)
        let answered = Atomic<Int>(0)
        let call: @Sendable () -> Void = {
            gate.wait()
            answered.add(1, ordering: .relaxed)
        }
        let started = Atomic<Bool>(false)
        #expect(threads.submit { started.store(true, ordering: .relaxed); call() } == nil)
        // The first is taken by the thread (blocked in it); two more fill the queue.
        try await waitUntil { started.load(ordering: .relaxed) }
        #expect(threads.submit(call) == nil)
        #expect(threads.submit(call) == nil)
        #expect(threads.submit(call) == .full)
        for _ in 0..<3 { gate.signal() }
        try await waitUntil { answered.load(ordering: .relaxed) == 3 }
        // Idle past its timeout: the thread ends, and the next call starts one again.
        try await waitUntil { threads.running == 0 }
        #expect(try await threads.run { 42 } == 42)
    }

    @Test func closeRunsWhatIsQueuedThenRefuses() async throws {
        let threads = BlockingThreads(name: "test-read", threads: 1, maxQueued: 8)
        let gate = DispatchSemaphore(value: 0)
        let ran = Mutex<[Int]>([])
        let started = Atomic<Bool>(false)
        #expect(threads.submit { started.store(true, ordering: .relaxed); gate.wait(); ran.withLock { $0.append(0) } } == nil)
        try await waitUntil { started.load(ordering: .relaxed) }
        for value in 1..<5 { #expect(threads.submit { ran.withLock { $0.append(value) } } == nil) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await threads.close() }
            // Closing: nothing new is queued, while what was queued still runs.
            try await waitUntil { threads.submit {} == .closed }
            gate.signal()
            try await group.waitForAll()
        }
        #expect(ran.withLock { $0 } == [0, 1, 2, 3, 4], "in the order queued")
        #expect(threads.running == 0)
        await #expect(throws: BlockingThreads.Refusal.closed) { try await threads.run { 1 } }
    }

    /// Many calls from many tasks, with threads that end after a millisecond idle: a thread
    /// timing out as a call arrives must neither lose the call nor keep a wake-up meant for another.
    @Test func noCallIsLostWhileThreadsComeAndGo() async throws {
        let threads = BlockingThreads(name: "test-read", threads: 3, maxQueued: 10_000, idleTimeout: .milliseconds(1))
        for wave in 0..<20 {
            let total = try await withThrowingTaskGroup(of: Int.self) { group in
                for value in 0..<(50 + wave * 10) {
                    group.addTask { try await threads.run { value } }
                }
                return try await group.reduce(0, +)
            }
            let count = 50 + wave * 10
            #expect(total == count * (count - 1) / 2)
            // Idle between waves, so threads end and start again.
            try await waitUntil { threads.running == 0 }
        }
        await threads.close()
    }

    @Test func databaseReadsSeeOneSnapshotAndAnswerOverloadAsABusError() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("reads-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let pool = try DurableDatabase.open(path: folder.appendingPathComponent("items.sqlite").path)
        try await pool.write { try $0.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY); INSERT INTO item (id) VALUES (1), (2)") }
        let reads = DatabaseReads(pool, name: "test-read", threads: 1, maxQueued: 1)
        // A write committed while a read is between its two statements is not seen by it.
        let between = Atomic<Bool>(false)
        let written = DispatchSemaphore(value: 0)
        async let counts = reads.read { db -> [Int] in
            let first = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? -1
            between.store(true, ordering: .relaxed)
            written.wait()
            return [first, try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? -1]
        }
        try await waitUntil { between.load(ordering: .relaxed) }
        try await pool.write { try $0.execute(sql: "INSERT INTO item (id) VALUES (3)") }
        // The one thread is busy with that read: one more waits, the next is refused.
        async let queued = reads.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") }
        try await waitUntil { reads.waiting == 1 }
        await #expect(throws: BusError(.overloaded, "1 reads already waiting")) { try await reads.read { _ in 0 } }
        written.signal()
        #expect(try await counts == [2, 2])
        #expect(try await queued == 3)
        // An error of the read itself reaches the caller as it was.
        await #expect(throws: DatabaseError.self) { try await reads.read { db in try Int.fetchOne(db, sql: "SELECT nothing FROM nowhere") } }
        await reads.close()
    }
}
