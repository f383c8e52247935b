import Foundation
import PhotoEditKit
import Testing
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// PhotoEditKit, the app's client library, against the real stack with the gateway as a process.
@Suite("The client library against the real stack", .serialized, .timeLimit(.minutes(5)))
struct ClientLibraryTests {
    static func client(_ port: Int, device: UUID = UUID()) -> PhotoEditClient {
        var client = PhotoEditClient(baseURL: URL(string: "http://127.0.0.1:\(port)")!, identity: .guest(deviceId: device))
        client.pollInterval = .milliseconds(200)
        return client
    }

    /// The whole flow with the gateway's tasks on Swift's pool, then on its event loops (its bus
    /// calls then go through each loop's own sockets, `EventLoopLane`).
    @Test(arguments: [false, true])
    func theAppsFlowFromSignInToDelete(tasksOnEventLoops: Bool) async throws {
        let system = try await JobSystem(workers: 1)
        let (live, livePort) = try await Self.gateway(system, extra: ["GATEWAY_TASKS_ON_EVENT_LOOPS": "\(tasksOnEventLoops)"])
        let app = Self.client(livePort)
        // me, with the Chat screen's badge
        let me = try await app.me()
        #expect(me.isGuest && !me.isPro && me.quota.dailyRemaining == 20 && me.quotaBadge == "20 Free Edits Left")
        #expect(try await app.effects().contains { $0.id == "auto-enhance" })
        // upload, create, follow
        let key = try await app.upload(try Data(contentsOf: JobSystem.fixture), filename: "photo.jpg")
        let ticket = try await app.createJob(imageKey: key, effect: "grayscale")
        #expect(ticket.status == "queued")
        var updates: [JobUpdate] = []
        for try await update in app.updates(of: ticket.jobId) { updates.append(update) }
        let done = try #require(updates.last)
        #expect(done.status == "completed" && done.resultUrl != nil)
        #expect(!(try await app.download(try #require(done.resultUrl))).isEmpty)
        #expect(try await app.me().quotaBadge == "19 Free Edits Left")
        // history, share, delete
        var pages: [HistoryPage] = []
        for try await page in app.history(pageSize: 10) { pages.append(page) }
        #expect(pages.flatMap(\.items).map(\.id) == [ticket.jobId])
        let link = try await app.share(ticket.jobId)
        #expect(link.url.contains("/s/"))
        try await app.delete(ticket.jobId)
        #expect(try await app.historyPage().items.isEmpty)
        // The job itself goes once jobs has purged it
        try await waitUntil {
            do { _ = try await app.status(of: ticket.jobId); return false } catch { return (error as? PhotoEditError) == .notFound }
        }
        await live.stop()
        await system.stop()
    }

    /// Waits (with a deadline) for a condition that reads main-actor state.
    @MainActor
    static func waitOnMain(within limit: Duration = .seconds(15), _ condition: @MainActor () async -> Bool) async throws {
        let deadline = ContinuousClock.now.advanced(by: limit)
        while ContinuousClock.now < deadline {
            if await condition() { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        Issue.record("the condition did not hold within \(limit)")
    }

    /// The gateway process with PUBLIC_BASE_URL pointing at its own port.
    static func gateway(_ system: JobSystem, extra: [String: String] = [:]) async throws -> (ServiceProcess, Int) {
        let port = freePort()
        return try await EventStreamTests.gatewayProcess(system, extra: ["GATEWAY_PORT": "\(port)", "PUBLIC_BASE_URL": "http://127.0.0.1:\(port)"].merging(extra) { _, new in new }, port: port)
    }

    @Test func aQuotaDenialIsTheTypedError() async throws {
        let system = try await JobSystem(workers: 0)
        let (gateway, port) = try await Self.gateway(system)
        let app = Self.client(port)
        let key = try await app.upload(try Data(contentsOf: JobSystem.fixture))
        for _ in 0..<20 { _ = try await app.createJob(imageKey: key, effect: "copy") }
        do {
            _ = try await app.createJob(imageKey: key, effect: "copy")
            Issue.record("the 21st edit was admitted")
        } catch {
            guard case .quotaExceeded(let windows, let retryAfter, let plan) = error else {
                Issue.record("expected quotaExceeded, got \(error)")
                return
            }
            #expect(windows == ["daily"] && retryAfter > 0 && plan == "free")
            #expect(error.description.contains("resets in"))
        }
        await gateway.stop()
        await system.stop()
    }

    @Test @MainActor func theCacheCatchesUpFromTheChangesFeedAndServesOffline() async throws {
        let system = try await JobSystem(workers: 1)
        let (gateway, port) = try await Self.gateway(system)
        let device = UUID()
        let app = Self.client(port, device: device)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("cache-\(UUID().uuidString).jsonl")
        defer { try? FileManager.default.removeItem(at: file) }
        // Given two finished edits
        let key = try await app.upload(try Data(contentsOf: JobSystem.fixture))
        var jobs: [String] = []
        for effect in ["grayscale", "copy"] {
            let ticket = try await app.createJob(imageKey: key, effect: effect)
            for try await _ in app.updates(of: ticket.jobId) {}
            jobs.append(ticket.jobId)
        }
        // When the cache refreshes, it has both, completed, newest first
        let cache = HistoryCache(client: app, fileURL: file)
        try await Self.waitOnMain { await cache.refresh() == nil && cache.items.count == 2 && cache.items.allSatisfy { $0.status == "completed" } }
        #expect(Set(cache.items.map(\.id)) == Set(jobs))
        #expect(cache.items.map(\.createdAt) == cache.items.map(\.createdAt).sorted(by: >))
        // And a deletion elsewhere arrives as a change
        try await app.delete(jobs[0])
        try await Self.waitOnMain { await cache.refresh() == nil && cache.items.map(\.id) == [jobs[1]] }
        await cache.settled()
        // When the gateway is gone, a new cache serves the file, says it is offline, and a
        // delete is rolled back
        await gateway.stop()
        let offline = HistoryCache(client: app, fileURL: file)
        await offline.settled()
        #expect(offline.items.map(\.id) == [jobs[1]])
        #expect(await offline.refresh() == .offline && offline.isOffline)
        #expect(await offline.delete(jobs[1]) == .offline)
        #expect(offline.items.map(\.id) == [jobs[1]])
        await system.stop()
    }
}
