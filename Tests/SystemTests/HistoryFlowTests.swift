import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

@Suite("History through the gateway", .serialized, .timeLimit(.minutes(5)))
struct HistoryFlowTests {
    @Test func pastEditsAreListedNewestFirstWithFilesFilteredAndSearched() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            // An empty history is 200 with an empty list
            let (empty, emptyBody) = try await JobSystem.get(client, "/api/v1/history", as: user)
            #expect(empty.status == .ok)
            #expect(JobSystem.ids(emptyBody).isEmpty && emptyBody["totalCount"] as? Int == 0 && emptyBody["hasMore"] as? Bool == false)
            // Given three finished jobs with prompts
            let key = try await JobSystem.upload(client, as: user)
            var jobIds: [String] = []
            for prompt in ["Golden sunset", "neon city", "misty forest"] {
                jobIds.append(try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "grayscale", prompt: prompt))
            }
            // When the history is listed (once the events have arrived)
            var body: [String: Any] = [:]
            try await waitUntil {
                body = try await JobSystem.get(client, "/api/v1/history", as: user).1
                return (body["items"] as? [[String: Any]])?.allSatisfy { $0["status"] as? String == "completed" } == true && JobSystem.ids(body).count == 3
            }
            // Then newest first, with the seed's fields and fetchable files
            #expect(JobSystem.ids(body) == jobIds.reversed())
            #expect(body["totalCount"] as? Int == 3)
            let first = try #require((body["items"] as? [[String: Any]])?.first)
            #expect(first["effectTitle"] as? String == "Black & White")
            #expect(first["effectId"] as? String == "grayscale")
            #expect(first["prompt"] as? String == "misty forest")
            #expect(first["originalImageKey"] as? String == key)
            #expect((first["createdAt"] as? String)?.hasSuffix("Z") == true)
            for field in ["thumbnailUrl", "resultUrl"] {
                let url = try #require(first[field] as? String)
                let file = try await client.execute(uri: JobSystem.path(url), method: .get)
                #expect(file.status == .ok && file.headers[.contentType] == "image/jpeg")
            }
            // And one item alone
            let (one, oneBody) = try await JobSystem.get(client, "/api/v1/history/\(jobIds[0])", as: user)
            #expect(one.status == .ok && oneBody["prompt"] as? String == "Golden sunset")
            // And the status filter and a substring search
            #expect(JobSystem.ids(try await JobSystem.get(client, "/api/v1/history?status=completed", as: user).1).count == 3)
            #expect(JobSystem.ids(try await JobSystem.get(client, "/api/v1/history?status=failed,cancelled", as: user).1).isEmpty)
            let search = try await JobSystem.get(client, "/api/v1/history?q=UNSET", as: user).1
            #expect(JobSystem.ids(search) == [jobIds[0]] && search["totalCount"] as? Int == 1)
            // And someone else sees none of it
            let stranger = JobSystem.guest(UUID())
            #expect(JobSystem.ids(try await JobSystem.get(client, "/api/v1/history", as: stranger).1).isEmpty)
            #expect(try await JobSystem.get(client, "/api/v1/history/\(jobIds[0])", as: stranger).0.status == .notFound)
            // And bad parameters are 400
            for query in ["limit=0", "limit=101", "limit=abc", "offset=-1", "status=queued", "groupBy=day", "cursor=nonsense"] {
                #expect(try await JobSystem.get(client, "/api/v1/history?\(query)", as: user).0.status == .badRequest, "\(query)")
            }
        }
        await system.stop()
    }

    @Test func offsetPagesAndCursorPagesListTheSameItems() async throws {
        let system = try await JobSystem(workers: 0)
        let user = JobSystem.guest(UUID()), userId = JobSystem.userId(ofGuest: user)
        let start = Date().addingTimeInterval(-86_400)
        try await system.feedHistory((0..<120).map { jobEvent(String(format: "page-%03d", $0), user: userId, createdAt: start.addingTimeInterval(Double($0))) })
        try await system.gateway { client in
            var byOffset: [String] = []
            for offset in stride(from: 0, to: 120, by: 50) {
                let body = try await JobSystem.get(client, "/api/v1/history?limit=50&offset=\(offset)", as: user).1
                #expect(body["totalCount"] as? Int == 120)
                byOffset += JobSystem.ids(body)
            }
            var byCursor: [String] = []
            var cursor: String? = nil
            var pages = 0
            repeat {
                let query = cursor.map { "&cursor=\($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)" } ?? ""
                let body = try await JobSystem.get(client, "/api/v1/history?limit=50\(query)", as: user).1
                byCursor += JobSystem.ids(body)
                cursor = body["nextCursor"] as? String
                pages += 1
                if pages == 1 {
                    // New items at the top do not shift the next cursor page
                    try await system.feedHistory([jobEvent("page-new", user: userId, createdAt: Date())])
                }
            } while cursor != nil && pages < 10
            #expect(byOffset.count == 120 && byOffset.first == "page-119" && byOffset.last == "page-000")
            #expect(byCursor == byOffset)
            // Another user's cursor is 400
            let firstCursor = try #require(try await JobSystem.get(client, "/api/v1/history?limit=10", as: user).1["nextCursor"] as? String)
            let other = try await JobSystem.get(client, "/api/v1/history?limit=10&cursor=\(firstCursor)", as: JobSystem.guest(UUID()))
            #expect(other.0.status == .badRequest)
            #expect(other.0.headers[.contentType] == "application/problem+json")
        }
        await system.stop()
    }

    @Test func monthSectionsFollowTheUsersTimeZoneAndLanguage() async throws {
        // Items of November 2025, kept: retention would sweep them on a 30-day plan.
        let system = try await JobSystem(workers: 0, quota: ["QUOTA_PLANS": #"{"free": {"daily": 20, "monthly": 600, "retentionDays": 3650}}"#])
        let user = JobSystem.guest(UUID()), userId = JobSystem.userId(ofGuest: user)
        _ = try await system.clients.quota.call(Quota.setPlan, SetPlan(userId: userId, plan: "free", timeZone: "Asia/Tokyo"))
        try await system.feedHistory([
            jobEvent("late-november", user: userId, createdAt: try Date("2025-11-30T23:30:00Z", strategy: .iso8601)),
            jobEvent("mid-november", user: userId, createdAt: try Date("2025-11-15T12:00:00Z", strategy: .iso8601)),
        ])
        try await system.gateway { client in
            let body = try await JobSystem.get(client, "/api/v1/history?groupBy=month", as: user).1
            let sections = try #require(body["sections"] as? [[String: Any]])
            #expect(sections.map { $0["month"] as? String } == ["2025-12", "2025-11"])
            #expect(sections.map { $0["title"] as? String } == ["December 2025", "November 2025"])
            #expect(JobSystem.ids(sections[0]) == ["late-november"])
            let (frenchResponse, french) = try await JobSystem.get(client, "/api/v1/history?groupBy=month", as: user, headers: [.acceptLanguage: "fr-FR,fr;q=0.9"])
            #expect((french["sections"] as? [[String: Any]])?.first?["title"] as? String == "décembre 2025",
                    "\(frenchResponse.status): \(String(buffer: frenchResponse.body))")
            #expect(try await JobSystem.get(client, "/api/v1/history", as: user).1["sections"] == nil)
        }
        await system.stop()
    }

    @Test func deleteRemovesTheJobAndItsFilesAndKeepsAnOriginalInUse() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            // Given two finished jobs of the same upload
            let key = try await JobSystem.upload(client, as: user)
            let first = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "grayscale")
            let second = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "copy")
            var item: [String: Any] = [:]
            try await waitUntil {
                item = try await JobSystem.get(client, "/api/v1/history/\(first)", as: user).1
                return item["status"] as? String == "completed"
            }
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: first, userId: JobSystem.userId(ofGuest: user)))
            let files = [job.resultKey!, job.thumbnailKey!]
            #expect(files.allSatisfy(system.blobExists))
            // Someone else's delete is 404 and changes nothing
            let stranger = try await client.execute(uri: "/api/v1/history/\(first)", method: .delete, headers: JobSystem.guest(UUID()))
            #expect(stranger.status == .notFound)
            // When the first is deleted
            let deleted = try await client.execute(uri: "/api/v1/history/\(first)", method: .delete, headers: user)
            #expect(deleted.status == .ok)
            #expect(JobSystem.json(deleted)["success"] as? Bool == true && JobSystem.json(deleted)["deletedItemId"] as? String == first)
            // Then it is gone from history at once, and the job and its files follow
            #expect(try await JobSystem.get(client, "/api/v1/history/\(first)", as: user).0.status == .notFound)
            #expect(!JobSystem.ids(try await JobSystem.get(client, "/api/v1/history", as: user).1).contains(first))
            try await waitUntil {
                let gone = try await client.execute(uri: "/api/v1/jobs/\(first)", method: .get, headers: user).status == .notFound
                return gone && !files.contains(where: system.blobExists)
            }
            // And the original stays while the second job uses it
            #expect(system.blobExists(key))
            // A delete sent again (its answer lost) is answered as the first was, and changes nothing
            #expect(try await client.execute(uri: "/api/v1/history/\(first)", method: .delete, headers: user).status == .ok)
            #expect(system.blobExists(key))
            // Once the second goes too, so does the original
            #expect(try await client.execute(uri: "/api/v1/history/\(second)", method: .delete, headers: user).status == .ok)
            try await waitUntil { !system.blobExists(key) }
        }
        await system.stop()
    }

    @Test func deletingAProcessingJobCancelsItAndRefunds() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID()), userId = JobSystem.userId(ofGuest: user)
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let created = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "slow-remote")
            let jobId = try JobSystem.jobId(of: created)
            try await waitUntil {
                try await JobSystem.get(client, "/api/v1/history/\(jobId)", as: user).1["status"] as? String == "processing"
            }
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)", method: .delete, headers: user).status == .ok)
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
                return usage.charges.first?.state == .released && usage.status.daily.used == 0
            }
            try await waitUntil { try await client.execute(uri: "/api/v1/jobs/\(jobId)", method: .get, headers: user).status == .notFound }
        }
        await system.stop()
    }

    @Test func aDeleteWhileJobsIsDownCompletesOnceJobsIsBack() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let jobId = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "grayscale")
            try await waitUntil { try await JobSystem.get(client, "/api/v1/history/\(jobId)", as: user).1["status"] as? String == "completed" }
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: JobSystem.userId(ofGuest: user)))
            // Given jobs is down
            await system.services.stop(.jobs)
            // When the item is deleted
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)", method: .delete, headers: user).status == .ok)
            // Then it is gone from history at once, while its files are still there
            #expect(try await JobSystem.get(client, "/api/v1/history/\(jobId)", as: user).0.status == .notFound)
            #expect(system.blobExists(job.resultKey!))
            // And once jobs is back, the purge completes by itself
            try system.services.restart(.jobs)
            _ = try await waitUntilHealthy(system.clients.jobs)
            try await waitUntil(within: .seconds(30)) {
                try await client.execute(uri: "/api/v1/jobs/\(jobId)", method: .get, headers: user).status == .notFound && !system.blobExists(job.resultKey!)
            }
        }
        await system.stop()
    }

    @Test func eventsMissedWhileHistoryWasDownArriveAndTheOutboxDrains() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // Given history is down while jobs complete
            await system.services.stop(.history)
            var jobIds: [String] = []
            for _ in 0..<4 { jobIds.append(try await JobSystem.finishedJob(client, as: user, imageKey: key)) }
            #expect(try system.jobsDueForHistory() > 0)
            // When history starts again
            try system.services.restart(.history)
            _ = try await waitUntilHealthy(system.clients.history)
            // Then every item arrives, completed, and the outbox drains to zero
            try await waitUntil(within: .seconds(30)) {
                let body = try await JobSystem.get(client, "/api/v1/history?status=completed", as: user).1
                return Set(JobSystem.ids(body)) == Set(jobIds)
            }
            try await waitUntil { try system.jobsDueForHistory() == 0 }
        }
        await system.stop()
    }

    @Test func retentionFollowsEachUsersCurrentPlan() async throws {
        let system = try await JobSystem(workers: 0, history: ["HISTORY_SWEEP_MS": "200"])
        let old = Date().addingTimeInterval(-31 * 86_400)
        // (The plan first: a sweep running between the items' arrival and a later plan change
        // would rightly sweep the pro user's old item under the free plan's 30 days.)
        _ = try await system.clients.quota.call(Quota.setPlan, SetPlan(userId: "pro-user", plan: "pro"))
        try await system.feedHistory([
            jobEvent("free-old", user: "free-user", createdAt: old),
            jobEvent("free-old-running", user: "free-user", status: .processing, createdAt: old),
            jobEvent("free-new", user: "free-user"),
            jobEvent("pro-old", user: "pro-user", createdAt: old),
        ])
        // The free user's 31-day-old item is swept; a running job and newer items stay
        try await waitUntil {
            try await system.clients.history.call(History.list, ListHistory(userId: "free-user")).items.map(\.jobId).sorted() == ["free-new", "free-old-running"]
        }
        #expect(try await system.clients.history.call(History.list, ListHistory(userId: "pro-user")).totalCount == 1)
        // After a change to free, the next sweep applies 30 days
        _ = try await system.clients.quota.call(Quota.setPlan, SetPlan(userId: "pro-user", plan: "free"))
        try await waitUntil { try await system.clients.history.call(History.list, ListHistory(userId: "pro-user")).totalCount == 0 }
        await system.stop()
    }

    @Test func theOlderClientsRouteKeepsItsShapeAndStatuses() async throws {
        let system = try await JobSystem(workers: 0)
        let guest = JobSystem.guest(UUID()), guestId = JobSystem.userId(ofGuest: guest)
        let member = try await JobSystem.signedIn("user-42")
        let now = Date()
        try await system.feedHistory([
            jobEvent("queued", user: "user-42", status: .queued, version: 1, prompt: nil, createdAt: now.addingTimeInterval(-4)),
            jobEvent("running", user: "user-42", status: .processing, version: 2, createdAt: now.addingTimeInterval(-3)),
            jobEvent("done", user: "user-42", status: .completed, createdAt: now.addingTimeInterval(-2), effectTitle: "Soft Focus"),
            jobEvent("broken", user: "user-42", status: .failed, createdAt: now.addingTimeInterval(-1)),
            jobEvent("stopped", user: "user-42", status: .cancelled, createdAt: now),
        ])
        try await system.gateway { client in
            let (response, body) = try await JobSystem.get(client, "/get-video-jobs?user_id=user-42", as: member)
            #expect(response.status == .ok)
            let jobs = try #require(body["jobs"] as? [[String: Any]])
            #expect(jobs.map { $0["job_id"] as? String } == ["stopped", "broken", "done", "running", "queued"])
            #expect(jobs.map { $0["status"] as? String } == ["failed", "failed", "completed", "processing", "pending"])
            let done = jobs[2]
            #expect(done["model_name"] as? String == "Soft Focus" && done["credits_used"] as? Int == 1)
            #expect(done["video_url"] is String && done["thumbnail_url"] is String)
            #expect((done["created_at"] as? String)?.hasSuffix("Z") == true)
            #expect(jobs[4]["prompt"] as? String == "" && jobs[0]["credits_used"] as? Int == 0)
            #expect(Set(done.keys) == ["job_id", "prompt", "model_name", "credits_used", "status", "video_url", "thumbnail_url", "created_at"])
            // A guest by device id, with no jobs: an empty list, not 404
            let guestAnswer = try await JobSystem.get(client, "/get-video-jobs?device_id=\(guest[.deviceId]!)", as: guest)
            #expect(guestAnswer.0.status == .ok && String(buffer: guestAnswer.0.body) == #"{"jobs":[]}"#)
            #expect(guestId.hasPrefix("device:"))
            // Someone else's id is 403
            #expect(try await JobSystem.get(client, "/get-video-jobs?user_id=user-42", as: guest).0.status == .forbidden)
            #expect(try await JobSystem.get(client, "/get-video-jobs?device_id=\(UUID().uuidString)", as: guest).0.status == .forbidden)
            #expect(try await JobSystem.get(client, "/get-video-jobs?user_id=user-42", as: [:]).0.status == .unauthorized)
            // With no id named, the caller's own
            let own = try await JobSystem.get(client, "/get-video-jobs", as: member)
            #expect(own.0.status == .ok && (own.1["jobs"] as? [[String: Any]])?.count == 5)
            // An id sent empty, or a device id that is not a UUID, is refused as the document
            // refuses it (user_id has a minimum length, device_id is a UUID)
            for query in ["user_id=&device_id=", "user_id=", "device_id=", "device_id=not-a-uuid"] {
                #expect(try await JobSystem.get(client, "/get-video-jobs?\(query)", as: member).0.status == .badRequest, "\(query)")
            }
            // The older build's status poll: one job in the same shape; anyone else's is 404
            let (status, one) = try await JobSystem.get(client, "/get-video-status?job_id=done", as: member)
            #expect(status.status == .ok && one["job_id"] as? String == "done" && one["status"] as? String == "completed")
            #expect(Set(one.keys) == ["job_id", "prompt", "model_name", "credits_used", "status", "video_url", "thumbnail_url", "created_at"])
            #expect(try await JobSystem.get(client, "/get-video-status?job_id=done", as: guest).0.status == .notFound)
            #expect(try await JobSystem.get(client, "/get-video-status", as: member).0.status == .badRequest)
        }
        await system.stop()
    }

    @Test func aShareLinkWorksWithoutAuthenticationUntilRevokedExpiredOrDeleted() async throws {
        let system = try await JobSystem(workers: 1, shareLifetime: 2)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let jobId = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "grayscale")
            try await waitUntil { try await JobSystem.get(client, "/api/v1/history/\(jobId)", as: user).1["status"] as? String == "completed" }
            func share() async throws -> String {
                let response = try await client.execute(uri: "/api/v1/history/\(jobId)/share", method: .post, headers: user)
                #expect(response.status == .created)
                #expect(JobSystem.json(response)["expiresAt"] is String)
                let url = try #require(JobSystem.json(response)["shareUrl"] as? String)
                return JobSystem.path(url)
            }
            // Works without authentication; revoked: 404
            let first = try await share()
            let opened = try await client.execute(uri: first, method: .get)
            #expect(opened.status == .ok && opened.headers[.contentType] == "image/jpeg")
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)/share", method: .delete, headers: user).status == .noContent)
            #expect(try await client.execute(uri: first, method: .get).status == .notFound)
            // Expired: 404
            let second = try await share()
            #expect(try await client.execute(uri: second, method: .get).status == .ok)
            try await waitUntil { try await client.execute(uri: second, method: .get).status == .notFound }
            // Deleted: 404
            let third = try await share()
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)", method: .delete, headers: user).status == .ok)
            #expect(try await client.execute(uri: third, method: .get).status == .notFound)
            // Someone else cannot share it
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)/share", method: .post, headers: JobSystem.guest(UUID())).status == .notFound)
        }
        await system.stop()
    }

    @Test func theChangesFeedCarriesUpsertsAndDeletionsAndExpiresOldTokens() async throws {
        let system = try await JobSystem(workers: 0, history: ["HISTORY_SWEEP_MS": "200", "HISTORY_CHANGES_KEEP_S": "1"])
        let user = JobSystem.guest(UUID()), userId = JobSystem.userId(ofGuest: user)
        try await system.feedHistory([jobEvent("a", user: userId), jobEvent("b", user: userId, status: .processing, version: 2)])
        try await system.gateway { client in
            let start = try await JobSystem.get(client, "/api/v1/history/changes", as: user).1
            #expect((start["changes"] as? [[String: Any]])?.count == 2)
            let token = try #require(start["nextToken"] as? String)
            try await system.feedHistory([jobEvent("b", user: userId, status: .completed, version: 3)])
            #expect(try await client.execute(uri: "/api/v1/history/a", method: .delete, headers: user).status == .ok)
            let since = try await JobSystem.get(client, "/api/v1/history/changes?since=\(token)", as: user)
            #expect(since.0.status == .ok)
            let changes = try #require(since.1["changes"] as? [[String: Any]])
            #expect(changes.map { $0["op"] as? String } == ["upsert", "delete"])
            #expect((changes[0]["item"] as? [String: Any])?["status"] as? String == "completed")
            #expect(changes[1]["id"] as? String == "a")
            // Once the deletion is older than the feed keeps, the old token is 410
            try await waitUntil { try await JobSystem.get(client, "/api/v1/history/changes?since=\(token)", as: user).0.status == .gone }
            #expect(try await JobSystem.get(client, "/api/v1/history/changes", as: user).0.status == .ok)
            #expect(try await JobSystem.get(client, "/api/v1/history/changes?since=forged", as: user).0.status == .badRequest)
        }
        await system.stop()
    }

    @Test func anItemIsReRunFromHistoryAsANewChargedJob() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID()), userId = JobSystem.userId(ofGuest: user)
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let jobId = try await JobSystem.finishedJob(client, as: user, imageKey: key, effect: "blur", prompt: "soft light")
            try await waitUntil { try await JobSystem.get(client, "/api/v1/history/\(jobId)", as: user).1["status"] as? String == "completed" }
            let rerun = try await client.execute(uri: "/api/v1/history/\(jobId)/rerun", method: .post, headers: user)
            #expect(rerun.status == .accepted)
            let newId = try JobSystem.jobId(of: rerun)
            #expect(newId != jobId)
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: newId, userId: userId))
            #expect(job.imageKey == key && job.effectId == "blur" && job.prompt == "soft light" && job.parameters == ["sigma": 2])
            #expect(try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).status.daily.used == 2)
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)/rerun", method: .post, headers: JobSystem.guest(UUID())).status == .notFound)
        }
        await system.stop()
    }
}
