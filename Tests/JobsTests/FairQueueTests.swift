import JobsCore
import Testing

@Suite("Fair queue", .timeLimit(.minutes(5)))
struct FairQueueTests {
    func job(_ user: String, _ index: Int, pro: Bool = false, effect: String = "copy") -> QueuedJob {
        QueuedJob(jobId: "\(user)-\(index)", userId: user, isPro: pro, effectId: effect)
    }

    @Test func oneUsersBurstDoesNotStarveAnother() {
        // Given user A queues 100 jobs, then user B queues 1
        var queue = FairQueue()
        for index in 0..<100 { queue.push(job("A", index)) }
        queue.push(job("B", 0))
        // When jobs are handed out one by one
        var order: [String] = []
        while let next = queue.pop() { order.append(next.jobId) }
        // Then B's job goes before A's tenth (it goes second), and A's keep their order
        let positionOfB = order.firstIndex(of: "B-0")!
        let positionOfTenthA = order.firstIndex(of: "A-9")!
        #expect(positionOfB < positionOfTenthA)
        #expect(positionOfB == 1)
        #expect(order.filter { $0.hasPrefix("A") } == (0..<100).map { "A-\($0)" })
        #expect(queue.count == 0)
    }

    @Test func proUsersGoFirstWhenConfigured() {
        var queue = FairQueue(proFirst: true)
        queue.push(job("free", 0))
        queue.push(job("pro", 0, pro: true))
        #expect(queue.pop()?.userId == "pro")
        var plain = FairQueue(proFirst: false)
        plain.push(job("free", 0))
        plain.push(job("pro", 0, pro: true))
        #expect(plain.pop()?.userId == "free")
    }

    @Test func workersOnlyGetEffectsTheyRun() {
        var queue = FairQueue()
        queue.push(job("A", 0, effect: "remote-ai"))
        queue.push(job("B", 0, effect: "copy"))
        #expect(queue.pop(where: { $0.effectId == "copy" })?.userId == "B")
        #expect(queue.pop(where: { $0.effectId == "copy" }) == nil)
        #expect(queue.pop()?.userId == "A")
    }

    @Test func removedAndRequeuedJobsKeepTheQueueConsistent() {
        var queue = FairQueue()
        queue.push(job("A", 0))
        queue.push(job("A", 1))
        let removed = queue.remove(jobId: "A-0", userId: "A")
        let removedTwice = queue.remove(jobId: "A-0", userId: "A")
        #expect(removed && !removedTwice)
        queue.push(job("A", 9), atFront: true)
        #expect(queue.pop()?.jobId == "A-9")
        #expect(queue.pop()?.jobId == "A-1")
        #expect(queue.pop() == nil)
        #expect(queue.count == 0)
    }
}
