import Foundation
import Hummingbird
import Messages

/// `GET /get-video-jobs?user_id=` or `?device_id=`: the older app build's history, in its own
/// snake_case shape and status enum (pending, processing, completed, failed). The id in the query
/// must be the caller's own; another answers 403; with none, the caller's own. `GET /get-video-status?job_id=`: one of the
/// caller's jobs in the same shape (the older build's status poll); anyone else's answers 404.
struct LegacyJobsController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let links: DownloadLinks

    func addRoutes(to router: Router<Context>) {
        let router = router.authenticated(by: authenticator)
        router.get("/get-video-jobs") { request, context in
            let caller = context.caller
            let query = request.uri.queryParameters
            // As the document gives them: a user_id sent is not empty, a device_id sent is a UUID.
            let user = query["user_id"].map(String.init), device = query["device_id"].map(String.init)
            if user?.isEmpty == true { throw Problem(.badRequest, detail: "user_id must not be empty.") }
            let deviceUser = try device.map { device -> String in
                guard let uuid = UUID(uuidString: device) else { throw Problem(.badRequest, detail: "device_id must be a UUID.") }
                return "device:" + uuid.uuidString.lowercased()
            }
            let named = user ?? deviceUser ?? caller.id
            guard named == caller.id else {
                throw Problem(.forbidden, detail: "You can only list your own jobs.")
            }
            let page = try await clients.call(.history, History.list, ListHistory(userId: caller.id, limit: 100))
            return try JSONResponse.make(.ok, JobList(jobs: page.items.map { VideoJob($0, links: links) }))
        }
        router.get("/get-video-status") { request, context in
            let caller = context.caller
            guard let jobId = request.uri.queryParameters["job_id"].map(String.init), !jobId.isEmpty else {
                throw Problem(.badRequest, detail: "Name the job with job_id.")
            }
            let item = try await clients.call(.history, History.get, HistoryItemReference(userId: caller.id, jobId: jobId))
            return try JSONResponse.make(.ok, VideoJob(item, links: links))
        }
    }

    struct JobList: Encodable {
        var jobs: [VideoJob]
    }

    /// The older app's `VideoJob`.
    struct VideoJob: Encodable {
        var job_id: String
        var prompt: String
        var model_name: String
        var credits_used: Int
        var status: String
        var video_url: String?
        var thumbnail_url: String?
        var created_at: Date

        init(_ item: HistoryItem, links: DownloadLinks) {
            job_id = item.jobId
            prompt = item.prompt ?? ""
            model_name = item.effectTitle
            credits_used = item.cost
            status = Self.status(item.status)
            let completed = item.status == .completed
            video_url = completed ? links.url(item.resultKey) : nil
            thumbnail_url = completed ? links.url(item.thumbnailKey) : nil
            created_at = item.createdAt
        }

        /// Its enum has no queued or cancelled: queued is pending, cancelled is failed.
        static func status(_ status: JobStatus) -> String {
            switch status {
            case .queued: "pending"
            case .processing: "processing"
            case .completed: "completed"
            case .failed, .cancelled: "failed"
            }
        }
    }
}
