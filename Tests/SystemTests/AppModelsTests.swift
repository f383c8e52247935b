import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

/// The app's own models, as the design documents in `../shared/seeds/` write them, decoding the
/// gateway's real answers with a plain `JSONDecoder` (ISO 8601 dates), and the requests those
/// documents show, sent word for word.
@Suite("The app's models decode our answers", .serialized, .timeLimit(.minutes(5)))
struct AppModelsTests {
    // MARK: 000 (History screen)

    struct HistoryItem: Identifiable, Codable {
        let id: String
        let thumbnailUrl: URL?
        let effectTitle: String
        let effectId: String
        let status: JobStatus
        let createdAt: Date
        let resultUrl: URL?
        let originalImageKey: String?
        let parameters: [String: AnyCodable]?
    }

    enum JobStatus: String, Codable {
        case completed, processing, failed, cancelled
    }

    /// The third-party `AnyCodable` the document uses for parameters, reduced to what JSON holds.
    struct AnyCodable: Codable {
        let value: Any
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let number = try? container.decode(Double.self) { value = number }
            else if let text = try? container.decode(String.self) { value = text }
            else if let flag = try? container.decode(Bool.self) { value = flag }
            else { value = () }
        }
        func encode(to encoder: any Encoder) throws {}
    }

    struct HistoryPage: Codable {
        let items: [HistoryItem]
        let totalCount: Int
        let hasMore: Bool
    }

    struct Deleted: Codable {
        let success: Bool
        let deletedItemId: String
    }

    // MARK: 001 (the older build's history)

    struct VideoJob: Identifiable, Codable {
        let job_id: String
        let prompt: String
        let model_name: String
        let credits_used: Int
        let status: JobStatus
        let video_url: String?
        let thumbnail_url: String?
        let created_at: Date
        var id: String { job_id }
        enum JobStatus: String, Codable {
            case pending, processing, completed, failed
        }
    }

    struct VideoJobsResponse: Codable {
        let jobs: [VideoJob]
    }

    // MARK: 004 (Chat screen): JSON shapes only, as the document gives them

    struct Presigned: Codable {
        let uploadUrl: String
        let imageKey: String
        let expiresIn: Int
    }

    struct Created: Codable {
        let jobId: String
        let status: String
        let createdAt: Date
    }

    struct Me: Codable {
        let id: String
        let email: String?
        let isPro: Bool
        let quota: Quota
        struct Quota: Codable {
            let dailyRemaining: Int
            let dailyLimit: Int
            let monthlyRemaining: Int
            let monthlyLimit: Int
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, _ response: TestResponse) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        do {
            return try decoder.decode(type, from: Data(buffer: response.body))
        } catch {
            // What was answered instead (seen once in the full suite: a creation without jobId).
            Issue.record("\(response.status) did not decode as \(type): \(String(buffer: response.body).prefix(400))")
            throw error
        }
    }

    @Test func everySeedShapeDecodesAndEverySeedRequestWorks() async throws {
        let system = try await JobSystem(workers: 1)
        let user = try await JobSystem.signedIn("app-\(UUID().uuidString.lowercased())")
        try await system.gateway { client in
            // 004: presign, upload, create with the Chat screen's request, users/me
            let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                   body: ByteBuffer(string: #"{"filename": "user_photo.jpg", "contentType": "image/jpeg"}"#))
            let presigned = try Self.decode(Presigned.self, presign)
            #expect(presigned.expiresIn == 900)
            let put = try await client.execute(uri: JobSystem.path(presigned.uploadUrl), method: .put,
                                               headers: [.contentType: "image/jpeg"], body: ByteBuffer(bytes: try Data(contentsOf: JobSystem.fixture)))
            #expect(put.status == .created)
            let create = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: """
                {"imageKey": "\(presigned.imageKey)", "model": "default", "parameters": {"fidelity": 0.8, "upscale": 2}}
                """))
            let created = try Self.decode(Created.self, create)
            #expect(created.status == "queued")
            let me = try Self.decode(Me.self, try await client.execute(uri: "/api/v1/users/me", method: .get, headers: user))
            #expect(!me.isPro && me.quota.dailyLimit == 20 && me.quota.dailyRemaining == 19 && me.quota.monthlyLimit == 600)
            _ = try await JobSystem.waitForStatus(client, as: user, jobId: created.jobId)

            // 000: the history page and its items
            try await waitUntil {
                let page = try Self.decode(HistoryPage.self, try await client.execute(uri: "/api/v1/history?limit=50&offset=0", method: .get, headers: user))
                return page.items.first?.status == .completed
            }
            let page = try Self.decode(HistoryPage.self, try await client.execute(uri: "/api/v1/history?limit=50&offset=0&status=completed", method: .get, headers: user))
            let item = try #require(page.items.first)
            #expect(page.totalCount == 1 && !page.hasMore && item.id == created.jobId && item.resultUrl != nil && item.thumbnailUrl != nil)
            #expect(item.parameters?["fidelity"]?.value as? Double == 0.8)
            // 000: its re-run request (effectId and parameters from the item)
            let rerun = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: """
                {"imageKey": "\(item.originalImageKey ?? "")", "effectId": "\(item.effectId)", "parameters": {"fidelity": 0.8, "upscale": 2}}
                """))
            let rerunJob = try Self.decode(Created.self, rerun)
            _ = try await JobSystem.waitForStatus(client, as: user, jobId: rerunJob.jobId)

            // 001: the older build's list
            let sub = try #require(JobSystem.json(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: user))["id"] as? String)
            try await waitUntil {
                let list = try Self.decode(VideoJobsResponse.self, try await client.execute(uri: "/get-video-jobs?user_id=\(sub)", method: .get, headers: user))
                return list.jobs.count == 2 && list.jobs.allSatisfy { $0.status == .completed }
            }

            // 000: delete
            let deleted = try Self.decode(Deleted.self, try await client.execute(uri: "/api/v1/history/\(rerunJob.jobId)", method: .delete, headers: user))
            #expect(deleted.success && deleted.deletedItemId == rerunJob.jobId)
        }
        await system.stop()
    }
}
