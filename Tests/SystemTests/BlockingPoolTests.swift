import Foundation
import Synchronization
import Testing
import WorkerKit

@Suite("Blocking pool", .timeLimit(.minutes(5)))
struct BlockingPoolTests {
    final class Observed: Sendable {
        let running = Atomic<Int>(0)
        let most = Atomic<Int>(0)
        let threads = Mutex<Set<UInt>>([])
        let gate = Atomic<Bool>(false)
    }

    @Test func blockingWorkRunsOnAtMostItsThreadsAndAllOfItCompletes() async throws {
        let pool = BlockingPool(threads: 2)
        let observed = Observed()
        // 40 calls that each block their thread for a moment
        let results = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<40 {
                group.addTask {
                    try await pool.run {
                        let now = observed.running.add(1, ordering: .relaxed).newValue
                        _ = observed.most.max(now, ordering: .relaxed)
                        observed.threads.withLock { _ = $0.insert(pthread_self()) }
                        usleep(2000)
                        observed.running.subtract(1, ordering: .relaxed)
                        return index
                    }
                }
            }
            return try await group.reduce(into: Set<Int>()) { $0.insert($1) }
        }
        #expect(results == Set(0..<40))
        #expect(observed.most.load(ordering: .relaxed) <= 2)
        #expect(observed.threads.withLock { $0.count } <= 2)
    }

    @Test func errorsComeBackToTheCallerAndAFullQueueRefusesAtOnce() async throws {
        struct Broken: Error {}
        let pool = BlockingPool(threads: 1, maxQueued: 1)
        await #expect(throws: Broken.self) { try await pool.run { throw Broken() } }
        // One call holds the thread, one waits: a third is refused, not queued
        let observed = Observed()
        defer { observed.gate.store(true, ordering: .relaxed) }  // whatever fails, nothing stays blocked
        async let first: Void = pool.run {
            observed.running.add(1, ordering: .relaxed)
            while !observed.gate.load(ordering: .relaxed) { usleep(1000) }
        }
        try await waitUntil { observed.running.load(ordering: .relaxed) == 1 }
        async let second: Void = pool.run {}
        try await waitUntil { pool.waiting == 1 }
        await #expect(throws: BlockingPool.Overloaded.self) { try await pool.run {} }
        observed.gate.store(true, ordering: .relaxed)
        try await first
        try await second
    }
}
