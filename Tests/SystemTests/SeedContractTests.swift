import AsyncHTTPClient
import Blobs
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import PhotoEditKit
import Testing

/// The app's flows as the seed documents (`../shared/seeds/`) write them, played field by field
/// against a live stack (`scripts/seed-contract.sh` starts one per deployment: the default,
/// `BLOB_STORE=s3`, `STORE=postgres`, and runs this suite against each). Every answer is decoded
/// with the seeds' own models: the structs `AppModelsTests` copied from the documents unchanged
/// (000's `HistoryItem`, `JobStatus`, `HistoryPage` and `Deleted`; 001's `VideoJob` and
/// `VideoJobsResponse`; 004's JSON shapes as `Presigned`, `Created` and `Me`), and the client
/// library's JSON-lines cache (002's `ChronologicalHistoryManager`, 003's scan history). Each
/// step prints one `seed-contract` line: the stack, the flow, the call and what it decoded.
///
/// Runs only with `SEED_CONTRACT_URL` (the gateway) set, with `JWT_SECRET` and
/// `ADAPTY_WEBHOOK_SECRET` of that stack: the whole suite skips it.
@Suite("Seed contract against a live stack", .serialized, .timeLimit(.minutes(10)),
       .enabled(if: ProcessInfo.processInfo.environment["SEED_CONTRACT_URL"] != nil))
struct SeedContractTests {
    typealias Seeds = AppModelsTests

    static let environment = ProcessInfo.processInfo.environment
    static let base = environment["SEED_CONTRACT_URL"] ?? ""
    static let stack = environment["SEED_CONTRACT_STACK"] ?? "default"

    /// One answer: status, headers and body.
    struct Answer {
        let status: Int
        let headers: HTTPHeaders
        let body: Data
    }

    /// Prints what a step decoded, as the check's output lists it.
    static func report(_ flow: String, _ step: String, _ decoded: Any) {
        print("seed-contract [\(stack)] \(flow): \(step) → \(decoded)")
    }

    static func call(_ method: HTTPMethod, _ url: String, headers: [String: String] = [:], body: Data? = nil) async throws -> Answer {
        var request = HTTPClientRequest(url: url.hasPrefix("http") ? url : base + url)
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let bytes = try await response.body.collect(upTo: 64 << 20)
        return Answer(status: Int(response.status.code), headers: response.headers, body: Data(buffer: bytes))
    }

    /// Decodes `answer` as the app does: a plain `JSONDecoder`, ISO 8601 dates.
    static func decode<T: Decodable>(_ type: T.Type, _ answer: Answer, _ step: String) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        do {
            return try decoder.decode(type, from: answer.body)
        } catch {
            Issue.record("\(step): \(answer.status) did not decode as \(type): \(error); body: \(String(decoding: answer.body.prefix(400), as: UTF8.self))")
            throw error
        }
    }

    /// A signed-in user of the stack: a JWT for `sub` signed with the stack's `JWT_SECRET`.
    static func token(_ sub: String) async throws -> String {
        try await JobSystem.token(sub, secret: environment["JWT_SECRET"] ?? "")
    }

    /// Waits for `condition` (a live stack's pace is its own: a minute at most).
    static func eventually(_ what: String, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now.advanced(by: .seconds(60))
        while try await !condition() {
            guard ContinuousClock.now < deadline else {
                Issue.record("\(what): not within 60 s")
                throw CancellationError()
            }
            try await Task.sleep(for: .milliseconds(250))
        }
    }

    /// A completed edit's result or thumbnail URL answers an image.
    static func downloads(_ url: URL?, _ what: String) async throws -> Int {
        let answer = try await call(.GET, try #require(url, "\(what) has no URL").absoluteString)
        #expect(answer.status == 200 && ImageSniffer.contentType(of: Array(answer.body.prefix(16))) != nil, "\(what): \(answer.status)")
        return answer.body.count
    }

    @Test func theAppsFlowsAsTheSeedsWriteThem() async throws {
        let sub = "seed-\(UUID().uuidString.lowercased())"
        let bearer = ["Authorization": "Bearer \(try await Self.token(sub))"]
        let json = bearer.merging(["Content-Type": "application/json"]) { $1 }

        // MARK: Chat screen (004)
        let flow = "chat screen"
        let me = try Self.decode(Seeds.Me.self, try await Self.call(.GET, "/api/v1/users/me", headers: bearer), "users/me")
        Self.report(flow, "GET /api/v1/users/me (the badge)", me)
        #expect(!me.isPro && me.quota.dailyRemaining == 20 && me.quota.dailyLimit == 20 && me.quota.monthlyLimit == 600)

        let presignBody = Data(#"{"filename": "user_photo.jpg", "contentType": "image/jpeg"}"#.utf8)
        let presigned = try Self.decode(Seeds.Presigned.self, try await Self.call(.POST, "/api/v1/uploads/presigned", headers: json, body: presignBody), "presign")
        Self.report(flow, "POST /api/v1/uploads/presigned", presigned)
        #expect(presigned.expiresIn == 900)
        // The PUT as the document describes it: the image, with its Content-Type and nothing else
        let photo = try Data(contentsOf: JobSystem.fixture)
        let upload = try await Self.call(.PUT, presigned.uploadUrl, headers: ["Content-Type": "image/jpeg"], body: photo)
        Self.report(flow, "PUT uploadUrl with only Content-Type", upload.status)
        #expect(upload.status == 200 || upload.status == 201, "the upload answered \(upload.status): \(String(decoding: upload.body.prefix(300), as: UTF8.self))")

        let chatRequest = Data(#"{"imageKey": "\#(presigned.imageKey)", "model": "default", "parameters": {"fidelity": 0.8, "upscale": 2}}"#.utf8)
        let createdAnswer = try await Self.call(.POST, "/api/v1/jobs", headers: json, body: chatRequest)
        let created = try Self.decode(Seeds.Created.self, createdAnswer, "create")
        Self.report(flow, "POST /api/v1/jobs (model, parameters)", created)
        #expect(createdAnswer.status == 202 && created.status == "queued")

        // Polled every 2 s, as ResultView does, until completed
        struct Status: Decodable { let jobId: String; let status: String; let progress: Double; let resultUrl: URL?; let thumbnailUrl: URL? }
        var status = try Self.decode(Status.self, try await Self.call(.GET, "/api/v1/jobs/\(created.jobId)/status", headers: bearer), "status")
        let deadline = ContinuousClock.now.advanced(by: .seconds(120))
        while !["completed", "failed", "cancelled"].contains(status.status), ContinuousClock.now < deadline {
            try await Task.sleep(for: .seconds(2))
            status = try Self.decode(Status.self, try await Self.call(.GET, "/api/v1/jobs/\(created.jobId)/status", headers: bearer), "status")
        }
        Self.report(flow, "GET /api/v1/jobs/{jobId}/status every 2 s", status)
        #expect(status.status == "completed")
        Self.report(flow, "GET resultUrl", "\(try await Self.downloads(status.resultUrl, "the result")) bytes of image")

        // At 0 credits the presign is the paywall's 429 (the app blocks uploads at 0)
        let copyRequest = Data(#"{"imageKey": "\#(presigned.imageKey)", "effectId": "copy"}"#.utf8)
        var left = try Self.decode(Seeds.Me.self, try await Self.call(.GET, "/api/v1/users/me", headers: bearer), "users/me").quota.dailyRemaining
        while left > 0 {
            let spent = try await Self.call(.POST, "/api/v1/jobs", headers: json, body: copyRequest)
            #expect(spent.status == 202, "a job with \(left) credits left answered \(spent.status)")
            guard spent.status == 202 else { break }
            left = try Self.decode(Seeds.Me.self, try await Self.call(.GET, "/api/v1/users/me", headers: bearer), "users/me").quota.dailyRemaining
        }
        let empty = try Self.decode(Seeds.Me.self, try await Self.call(.GET, "/api/v1/users/me", headers: bearer), "users/me")
        Self.report(flow, "GET /api/v1/users/me at 0", empty)
        let refused = try await Self.call(.POST, "/api/v1/uploads/presigned", headers: json, body: presignBody)
        struct QuotaProblem: Decodable { let status: Int; let code: String? }
        Self.report(flow, "POST /api/v1/uploads/presigned at 0", try Self.decode(QuotaProblem.self, refused, "presign at 0"))
        #expect(refused.status == 429 && refused.headers.first(name: "Retry-After") != nil)

        // The Adapty purchase (its webhook, as Adapty's documentation shapes it) makes the user PRO
        let purchase = ChatScreenTests.event("subscription_started", user: sub, expiresAt: Date().addingTimeInterval(30 * 86_400))
        let applied = try await Self.call(.POST, "/webhooks/adapty", headers: ["Content-Type": "application/json", "Authorization": Self.environment["ADAPTY_WEBHOOK_SECRET"] ?? ""],
                                          body: Data(buffer: purchase))
        #expect(applied.status == 200, "the webhook answered \(applied.status)")
        let pro = try Self.decode(Seeds.Me.self, try await Self.call(.GET, "/api/v1/users/me", headers: bearer), "users/me")
        Self.report(flow, "POST /webhooks/adapty subscription_started, then GET /api/v1/users/me", pro)
        #expect(pro.isPro)
        #expect(try await Self.call(.POST, "/api/v1/uploads/presigned", headers: json, body: presignBody).status == 200)

        // MARK: History screen (000)
        let history = "history screen"
        var page = try Self.decode(Seeds.HistoryPage.self, try await Self.call(.GET, "/api/v1/history?limit=50&offset=0", headers: bearer), "history")
        try await Self.eventually("the chat edit completed in history") {
            page = try Self.decode(Seeds.HistoryPage.self, try await Self.call(.GET, "/api/v1/history?limit=50&offset=0", headers: bearer), "history")
            return page.items.contains { $0.id == created.jobId && $0.status == .completed }
        }
        Self.report(history, "GET /api/v1/history?limit=50&offset=0", "\(page.items.count) items of \(page.totalCount), hasMore \(page.hasMore)")
        let item = try #require(page.items.first { $0.id == created.jobId })
        Self.report(history, "its item", item)
        #expect(item.originalImageKey == presigned.imageKey && item.parameters?["fidelity"]?.value as? Double == 0.8)

        let search = try Self.decode(Seeds.HistoryPage.self, try await Self.call(.GET, "/api/v1/history?q=\(item.effectTitle.split(separator: " ")[0])", headers: bearer), "search")
        Self.report(history, "GET /api/v1/history?q=\(item.effectTitle.split(separator: " ")[0])", "\(search.items.count) items")
        #expect(search.items.contains { $0.id == item.id })
        struct Sectioned: Decodable {
            struct Section: Decodable { let month: String; let title: String; let items: [Seeds.HistoryItem] }
            let sections: [Section]
        }
        let sectioned = try Self.decode(Sectioned.self, try await Self.call(.GET, "/api/v1/history?groupBy=month", headers: bearer), "month sections")
        Self.report(history, "GET /api/v1/history?groupBy=month", sectioned.sections.map { "\($0.title): \($0.items.count)" })
        #expect(sectioned.sections.first?.items.contains { $0.id == item.id } == true)
        Self.report(history, "GET thumbnailUrl", "\(try await Self.downloads(item.thumbnailUrl, "the thumbnail")) bytes of image")

        let rerun = try Self.decode(Seeds.Created.self, try await Self.call(.POST, "/api/v1/history/\(item.id)/rerun", headers: bearer), "re-run")
        Self.report(history, "POST /api/v1/history/{id}/rerun", rerun)
        struct ShareLink: Decodable { let shareUrl: String; let expiresAt: Date }
        let share = try Self.decode(ShareLink.self, try await Self.call(.POST, "/api/v1/history/\(item.id)/share", headers: bearer), "share")
        Self.report(history, "POST /api/v1/history/{id}/share", share)
        var shared = try await Self.call(.GET, share.shareUrl)
        if shared.status == 302, let location = shared.headers.first(name: "Location") { shared = try await Self.call(.GET, location) }
        #expect(shared.status == 200 && ImageSniffer.contentType(of: Array(shared.body.prefix(16))) != nil, "the share link answered \(shared.status)")

        let deleted = try Self.decode(Seeds.Deleted.self, try await Self.call(.DELETE, "/api/v1/history/\(item.id)", headers: bearer), "delete")
        Self.report(history, "DELETE /api/v1/history/{id}", deleted)
        #expect(deleted.success && deleted.deletedItemId == item.id)
        try await Self.eventually("the deleted edit's files gone") {
            let result = try await Self.call(.GET, status.resultUrl!.absoluteString), thumbnail = try await Self.call(.GET, item.thumbnailUrl!.absoluteString)
            return result.status != 200 && thumbnail.status != 200
        }
        Self.report(history, "GET resultUrl and thumbnailUrl after the delete", "gone")
        #expect(try await Self.call(.GET, share.shareUrl).status == 404)

        // MARK: History analysis (001): the older build's routes and the models' prices
        let older = "history analysis"
        let userId: String? = me.id
        var jobs = try Self.decode(Seeds.VideoJobsResponse.self, try await Self.call(.GET, "/get-video-jobs?user_id=\(userId ?? "")", headers: bearer), "get-video-jobs")
        try await Self.eventually("the re-run in the older list") {
            jobs = try Self.decode(Seeds.VideoJobsResponse.self, try await Self.call(.GET, "/get-video-jobs?user_id=\(userId ?? "")", headers: bearer), "get-video-jobs")
            return jobs.jobs.contains { $0.job_id == rerun.jobId }
        }
        Self.report(older, "GET /get-video-jobs?user_id=", "\(jobs.jobs.count) jobs; first \(jobs.jobs.first.map { "\($0)" } ?? "none")")
        #expect(!jobs.jobs.contains { $0.job_id == item.id }, "a deleted edit is not listed")
        let one = try Self.decode(Seeds.VideoJob.self, try await Self.call(.GET, "/get-video-status?job_id=\(rerun.jobId)", headers: bearer), "get-video-status")
        Self.report(older, "GET /get-video-status?job_id=", one)
        struct Effects: Decodable { struct Effect: Decodable { let id: String; let credits: Int }; let effects: [Effect] }
        let effects = try Self.decode(Effects.self, try await Self.call(.GET, "/api/v1/effects", headers: bearer), "effects")
        Self.report(older, "GET /api/v1/effects (credits by model)", effects.effects.map { "\($0.id)=\($0.credits)" }.joined(separator: ", "))
        #expect(one.credits_used == effects.effects.first { $0.id == "auto-enhance" }?.credits)

        // MARK: JSON-lines history manager (002) and scan history (003): the client library's cache
        try await Self.offlineCache(sub: sub, expecting: try Self.decode(Seeds.HistoryPage.self,
                                                                        try await Self.call(.GET, "/api/v1/history?limit=100", headers: bearer), "history"))
    }

    /// The client library's offline history: synced from the changes feed into its JSON-lines
    /// file, it holds what the history route lists, line by line.
    @MainActor
    static func offlineCache(sub: String, expecting page: Seeds.HistoryPage) async throws {
        let flow = "JSON-lines history"
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("seed-contract-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("history.jsonl")
        let client = PhotoEditClient(baseURL: URL(string: base)!, identity: .token({ try await Self.token(sub) }))
        let cache = HistoryCache(client: client, fileURL: file)
        let failure = await cache.refresh()
        #expect(failure == nil, "the sync failed: \(String(describing: failure))")
        await cache.settled()
        Self.report(flow, "HistoryCache.refresh() from GET /api/v1/history/changes", "\(cache.items.count) items, offline \(cache.isOffline)")
        #expect(Set(cache.items.map(\.id)) == Set(page.items.map(\.id)))
        // Each line of the file is one entry of the manager (written by its own JSONEncoder)
        let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        let decoder = JSONDecoder()
        let entries = try lines.map { try decoder.decode(HistoryEntry<HistoryCache.Record>.self, from: Data($0.utf8)) }
        Self.report(flow, "\(file.lastPathComponent)", "\(entries.count) lines, \(entries.compactMap(\.data.item).count) items and the feed's token")
        #expect(Set(entries.compactMap(\.data.item?.id)) == Set(page.items.map(\.id)))
        // And a second cache on the same file serves it without the gateway (offline)
        let offline = HistoryCache(client: PhotoEditClient(baseURL: URL(string: "http://127.0.0.1:9")!, identity: .token({ try await Self.token(sub) })), fileURL: file)
        _ = await offline.refresh()
        await offline.settled()
        Self.report(flow, "the same file offline", "\(offline.items.count) items, offline \(offline.isOffline)")
        #expect(offline.isOffline && Set(offline.items.map(\.id)) == Set(page.items.map(\.id)))
    }
}
