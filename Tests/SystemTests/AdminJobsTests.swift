import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import Testing
import TestSupport

/// The operators' admin API on a live system: jobs across users by filter and cursor, one job in
/// detail, cancels by ids or by filter that say what they changed and are idempotent, the viewer
/// token that reads and may not act, and an audit entry per action.
@Suite("The operators' admin API", .serialized, .timeLimit(.minutes(5)))
struct AdminJobsTests {
    static let viewerToken = "viewer-token-for-the-admin-tests"

    @Test func operatorsFindJobsActOnThemAndEveryActionIsAudited() async throws {
        // No worker: the jobs stay queued until an operator acts.
        let system = try await JobSystem(workers: 0, gateway: ["VIEWER_TOKEN": Self.viewerToken])
        let admin: HTTPFields = [.authorization: "Bearer \(JobSystem.adminToken)", .contentType: "application/json"]
        let viewer: HTTPFields = [.authorization: "Bearer \(Self.viewerToken)", .contentType: "application/json"]
        let alice = JobSystem.guest(UUID()), bob = JobSystem.guest(UUID())
        try await system.gateway { client in
            func get(_ uri: String, _ headers: HTTPFields = admin) async throws -> (HTTPResponse.Status, [String: Any]) {
                let response = try await client.execute(uri: uri, method: .get, headers: headers)
                return (response.status, JobSystem.json(response))
            }
            func post(_ uri: String, _ body: String, _ headers: HTTPFields = admin) async throws -> (HTTPResponse.Status, [String: Any]) {
                let response = try await client.execute(uri: uri, method: .post, headers: headers, body: ByteBuffer(string: body))
                return (response.status, JobSystem.json(response))
            }
            func ids(_ page: [String: Any]) -> [String] { (page["jobs"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String } }

            var aliceJobs: [String] = [], bobJobs: [String] = []
            let aliceKey = try await JobSystem.upload(client, as: alice), bobKey = try await JobSystem.upload(client, as: bob)
            for effect in ["copy", "grayscale", "copy"] {
                aliceJobs.append(try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: aliceKey, effect: effect)))
            }
            for _ in 0..<2 { bobJobs.append(try JobSystem.jobId(of: try await JobSystem.createJob(client, as: bob, imageKey: bobKey, effect: "copy"))) }
            let aliceId = try #require(JobSystem.json(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: alice))["id"] as? String)

            // Across users, newest first, with the counts by state; the viewer reads too
            let (status, all) = try await get("/admin/v1/jobs")
            #expect(status == .ok && ids(all) == (aliceJobs + bobJobs).reversed())
            #expect((all["counts"] as? [String: Int])?["queued"] == 5)
            #expect(try await get("/admin/v1/jobs", viewer).0 == .ok)
            // Filters, and pages by cursor
            #expect(ids(try await get("/admin/v1/jobs?user=\(aliceId.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")").1) == aliceJobs.reversed())
            #expect(ids(try await get("/admin/v1/jobs?effect=grayscale").1) == [aliceJobs[1]])
            #expect(ids(try await get("/admin/v1/jobs?provider=none&state=queued").1).count == 5)
            #expect(ids(try await get("/admin/v1/jobs?provider=gemini").1).isEmpty)
            let first = try await get("/admin/v1/jobs?limit=2").1
            let cursor = try #require(first["nextCursor"] as? String)
            let second = try await get("/admin/v1/jobs?limit=2&cursor=\(cursor)").1
            #expect(ids(first) + ids(second) == Array((aliceJobs + bobJobs).reversed().prefix(4)))
            for bad in ["state=lost", "limit=0", "from=yesterday", "cursor=garbage"] {
                #expect(try await get("/admin/v1/jobs?\(bad)").0 == .badRequest, "\(bad)")
            }
            // Users and guests are not operators
            #expect(try await get("/admin/v1/jobs", alice).0 == .unauthorized)
            #expect(try await get("/admin/v1/jobs", [.authorization: "Bearer not-a-token"]).0 == .forbidden)

            // One job in detail: whose it is, how its credits stand, its input as a signed link
            let (detailStatus, detail) = try await get("/admin/v1/jobs/\(aliceJobs[0])")
            #expect(detailStatus == .ok && (detail["job"] as? [String: Any])?["userId"] as? String == aliceId)
            #expect(detail["settlement"] as? String == "reserved" && (detail["inputUrl"] as? String)?.isEmpty == false)
            #expect(try await get("/admin/v1/jobs/no-such-job").0 == .notFound)

            // A viewer may not act: 403, nothing changes, nothing audited
            #expect(try await post("/admin/v1/jobs/cancel", #"{"ids": ["\#(aliceJobs[0])"]}"#, viewer).0 == .forbidden)
            #expect(try await post("/admin/v1/jobs/cancel", #"{"ids": []}"#).0 == .badRequest)
            #expect(try await post("/admin/v1/jobs/cancel", #"{"ids": ["a"], "filter": {}}"#).0 == .badRequest)
            #expect(try await post("/admin/v1/jobs/cancel", #"{"filter": {"state": "lost"}}"#).0 == .badRequest)

            // Cancels by ids and by filter say what they changed, and are idempotent
            let byIds = try await post("/admin/v1/jobs/cancel", #"{"ids": ["\#(aliceJobs[0])"]}"#)
            #expect(byIds.0 == .ok && byIds.1["matched"] as? Int == 1 && byIds.1["changed"] as? Int == 1)
            #expect(try await post("/admin/v1/jobs/cancel", #"{"ids": ["\#(aliceJobs[0])"]}"#).1["changed"] as? Int == 0)
            let bobFilter = #"{"filter": {"user": "\#(try #require(JobSystem.json(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: bob))["id"] as? String))", "state": "queued"}}"#
            let byFilter = try await post("/admin/v1/jobs/cancel", bobFilter)
            #expect(byFilter.1["matched"] as? Int == 2 && byFilter.1["changed"] as? Int == 2)
            #expect(try await post("/admin/v1/jobs/cancel", bobFilter).1["changed"] as? Int == 0)
            let cancelled = try await JobSystem.waitForStatus(client, as: alice, jobId: aliceJobs[0])
            #expect(cancelled["status"] as? String == "cancelled")
            #expect((try await get("/admin/v1/jobs").1["counts"] as? [String: Int])?["cancelled"] == 3)
            #expect(try await get("/admin/v1/jobs/\(aliceJobs[0])").1["settlement"] as? String == "released")

            // A plan change is audited too; a viewer's is refused
            let plan = try await client.execute(uri: "/admin/v1/users/\(aliceId)/plan", method: .put, headers: viewer, body: ByteBuffer(string: #"{"plan": "pro"}"#))
            #expect(plan.status == .forbidden)
            let planned = try await client.execute(uri: "/admin/v1/users/\(aliceId)/plan", method: .put, headers: admin, body: ByteBuffer(string: #"{"plan": "pro"}"#))
            #expect(planned.status == .ok)

            // The audit log: one entry per action, newest first, read by the viewer too
            let (auditStatus, audit) = try await get("/admin/v1/audit", viewer)
            let entries = audit["entries"] as? [[String: Any]] ?? []
            #expect(auditStatus == .ok && entries.map { $0["action"] as? String ?? "" } == ["users.plan", "jobs.cancel", "jobs.cancel", "jobs.cancel", "jobs.cancel"])
            #expect(entries.map { $0["count"] as? Int ?? -1 } == [1, 0, 2, 0, 1])
            #expect((entries[2]["filter"] as? String)?.contains("queued") == true && entries[4]["target"] as? String == aliceJobs[0])
            #expect(entries.allSatisfy { $0["actor"] as? String == "admin" && $0["at"] as? String != nil })
        }
        await system.stop()
    }

    /// A system on SQLite, or with quota and jobs on PostgreSQL (fresh databases of the test server).
    static func system(_ backend: String) async throws -> JobSystem {
        guard backend == "postgres" else { return try await JobSystem(workers: 1, gateway: ["VIEWER_TOKEN": Self.viewerToken]) }
        let quota = try await TestPostgres.freshDatabase(), jobs = try await TestPostgres.freshDatabase()
        return try await JobSystem(workers: 1, quota: ["QUOTA_DATABASE_URL": TestPostgres.url(quota)], jobs: ["JOBS_DATABASE_URL": TestPostgres.url(jobs)],
                                   gateway: ["VIEWER_TOKEN": Self.viewerToken])
    }

    @Test(arguments: ["sqlite", "postgres"]) func aFailedJobIsRetriedWithItsCreditsChargedAgainAndCreditsAreGrantedAndTakenBack(backend: String) async throws {
        let system = try await Self.system(backend)
        let admin: HTTPFields = [.authorization: "Bearer \(JobSystem.adminToken)", .contentType: "application/json"]
        let viewer: HTTPFields = [.authorization: "Bearer \(Self.viewerToken)", .contentType: "application/json"]
        let alice = JobSystem.guest(UUID())
        let aliceId = "device:\(alice[.deviceId]!.lowercased())"
        try await system.gateway { client in
            func post(_ uri: String, _ body: String, _ headers: HTTPFields = admin) async throws -> (HTTPResponse.Status, [String: Any]) {
                let response = try await client.execute(uri: uri, method: .post, headers: headers, body: ByteBuffer(string: body))
                return (response.status, JobSystem.json(response))
            }
            /// What `users/me` says is left today.
            func remainingToday() async throws -> Int? {
                let me = JobSystem.json(try await client.execute(uri: "/api/v1/users/me", method: .get, headers: alice))
                return (me["quota"] as? [String: Any])?["dailyRemaining"] as? Int
            }
            let key = try await JobSystem.upload(client, as: alice)
            let jobId = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "until-fixed-remote"))
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: jobId)["status"] as? String == "failed")
            // Its credit came back
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: aliceId))
                return usage.status.daily.used == 0 && usage.charges.allSatisfy { $0.state == .released }
            }
            // The operator finds it by its error and retries it: a viewer may not
            let encodedUser = aliceId.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            let found = JobSystem.json(try await client.execute(uri: "/admin/v1/jobs?state=failed&effect=until-fixed-remote&error=400&user=\(encodedUser)", method: .get, headers: viewer))
            #expect((found["jobs"] as? [[String: Any]])?.compactMap { $0["id"] as? String } == [jobId])
            #expect(try await post("/admin/v1/jobs/retry", #"{"ids": ["\#(jobId)"]}"#, viewer).0 == .forbidden)
            system.providerLoad.fixed = true
            let retried = try await post("/admin/v1/jobs/retry", #"{"filter": {"state": "failed", "effect": "until-fixed-remote", "error": "400"}}"#)
            #expect(retried.0 == .ok && retried.1["matched"] as? Int == 1 && retried.1["changed"] as? Int == 1 && retried.1["denied"] as? Int == 0)
            // It runs again with the same id and completes; its credit is charged again, once
            let completed = try await JobSystem.waitForStatus(client, as: alice, jobId: jobId)
            #expect(completed["status"] as? String == "completed")
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: aliceId))
                return usage.status.daily.used == 1 && usage.charges.first { $0.jobId == jobId }?.state == .committed
            }
            // Its two attempts, each with its worker and how it ended
            let detail = JobSystem.json(try await client.execute(uri: "/admin/v1/jobs/\(jobId)", method: .get, headers: viewer))
            let attempts = detail["attempts"] as? [[String: Any]] ?? []
            #expect(attempts.compactMap { $0["outcome"] as? String } == ["failed", "completed"])
            #expect(attempts.allSatisfy { ($0["workerId"] as? String)?.isEmpty == false && $0["startedAt"] as? String != nil && $0["endedAt"] as? String != nil })
            #expect((attempts.first?["error"] as? String)?.contains("400") == true)
            // Idempotent: it is not failed any more
            #expect(try await post("/admin/v1/jobs/retry", #"{"ids": ["\#(jobId)"]}"#).1["changed"] as? Int == 0)

            // Credits: granted and taken back, with a reason, moving users/me exactly
            #expect(try await remainingToday() == 19)
            #expect(try await post("/admin/v1/users/\(encodedUser)/credits", #"{"credits": 10, "reason": "a failed edit"}"#, viewer).0 == .forbidden)
            for bad in [#"{"credits": 0, "reason": "x"}"#, #"{"credits": 5}"#, #"{"credits": 5, "reason": ""}"#, #"{"credits": "5", "reason": "x"}"#] {
                #expect(try await post("/admin/v1/users/\(encodedUser)/credits", bad).0 == .badRequest, "\(bad)")
            }
            var keyed = admin
            keyed[HTTPField.Name("Idempotency-Key")!] = "support-ticket-42"
            let granted = try await post("/admin/v1/users/\(encodedUser)/credits", #"{"credits": 10, "reason": "a failed edit"}"#, keyed)
            #expect(granted.0 == .ok && (granted.1["daily"] as? [String: Any])?["remaining"] as? Int == 29)
            // The same key again is the same grant
            #expect(try await post("/admin/v1/users/\(encodedUser)/credits", #"{"credits": 10, "reason": "a failed edit"}"#, keyed).0 == .ok)
            #expect(try await remainingToday() == 29)
            let taken = try await post("/admin/v1/users/\(encodedUser)/credits", #"{"credits": -4, "reason": "granted twice by mistake"}"#)
            #expect(taken.0 == .ok && (taken.1["daily"] as? [String: Any])?["remaining"] as? Int == 25)
            #expect(try await remainingToday() == 25)

            // Each action is audited, with its reason
            let audit = JobSystem.json(try await client.execute(uri: "/admin/v1/audit", method: .get, headers: viewer))["entries"] as? [[String: Any]] ?? []
            #expect(audit.map { $0["action"] as? String ?? "" } == ["users.takeback", "users.grant", "users.grant", "jobs.retry", "jobs.retry"])
            #expect(audit.map { $0["count"] as? Int ?? -1 } == [4, 0, 10, 0, 1])
            #expect(audit[0]["detail"] as? String == "granted twice by mistake" && audit[0]["target"] as? String == aliceId)
        }
        await system.stop()
    }

    @Test(arguments: ["sqlite", "postgres"]) func pausingResumingConcurrencyAndDrainingSteerDispatchLosingNoJob(backend: String) async throws {
        let system = try await Self.system(backend)
        let admin: HTTPFields = [.authorization: "Bearer \(JobSystem.adminToken)", .contentType: "application/json"]
        let viewer: HTTPFields = [.authorization: "Bearer \(Self.viewerToken)", .contentType: "application/json"]
        let alice = JobSystem.guest(UUID())
        try await system.gateway { client in
            func call(_ method: HTTPRequest.Method, _ uri: String, _ body: String? = nil, _ headers: HTTPFields? = nil) async throws -> (HTTPResponse.Status, [String: Any]) {
                let response = try await client.execute(uri: uri, method: method, headers: headers ?? admin, body: body.map { ByteBuffer(string: $0) })
                return (response.status, JobSystem.json(response))
            }
            func overview() async throws -> [String: Any] { try await call(.get, "/admin/v1/overview", nil, viewer).1 }
            func row(_ list: String, _ key: String, _ name: String, in overview: [String: Any]) -> [String: Any]? {
                (overview[list] as? [[String: Any]])?.first { $0[key] as? String == name }
            }
            let key = try await JobSystem.upload(client, as: alice)
            // The worker is listed with what it announced
            try await waitUntil { ((try await overview())["workers"] as? [[String: Any]])?.count == 1 }
            let worker = try #require((try await overview()["workers"] as? [[String: Any]])?.first)
            let workerId = try #require(worker["id"] as? String)
            #expect(worker["capacity"] as? Int == 1 && worker["host"] as? String != nil && worker["version"] as? String != nil && worker["drained"] as? Bool == false)

            // Pause the built-in effects' provider: a job waits, queued, and the overview says so
            #expect(try await call(.post, "/admin/v1/providers/none/pause", nil, viewer).0 == .forbidden)
            #expect(try await call(.post, "/admin/v1/providers/no-such-provider/pause").0 == .notFound)
            #expect(try await call(.post, "/admin/v1/effects/no-such-effect/pause").0 == .notFound)
            let paused = try await call(.post, "/admin/v1/providers/none/pause")
            #expect(paused.0 == .ok && paused.1["pausedProviders"] as? [String] == ["none"])
            let waiting = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "copy"))
            try await waitUntil { (row("effects", "effect", "copy", in: try await overview())?["queued"] as? Int) == 1 }
            let during = try await overview()
            #expect(row("providers", "provider", "none", in: during)?["paused"] as? Bool == true)
            #expect(row("effects", "effect", "copy", in: during)?["oldestQueuedAt"] as? String != nil)
            #expect(JobSystem.json(try await client.execute(uri: "/api/v1/jobs/\(waiting)", method: .get, headers: alice))["status"] as? String == "queued")
            // Resumed: it runs and completes
            #expect(try await call(.post, "/admin/v1/providers/none/resume").0 == .ok)
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: waiting)["status"] as? String == "completed")

            // An effect paused likewise
            #expect(try await call(.post, "/admin/v1/effects/grayscale/pause").0 == .ok)
            let gray = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "grayscale"))
            let copy = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "copy"))
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: copy)["status"] as? String == "completed")
            #expect(JobSystem.json(try await client.execute(uri: "/api/v1/jobs/\(gray)", method: .get, headers: alice))["status"] as? String == "queued")
            #expect(try await call(.post, "/admin/v1/effects/grayscale/resume").0 == .ok)
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: gray)["status"] as? String == "completed")

            // A provider's concurrency, live, and back to the configured one
            #expect(try await call(.put, "/admin/v1/providers/remote/concurrency", #"{"limit": 0}"#).0 == .badRequest)
            let limited = try await call(.put, "/admin/v1/providers/remote/concurrency", #"{"limit": 2}"#)
            #expect(limited.0 == .ok && (limited.1["providerLimits"] as? [String: Int]) == ["remote": 2])
            let remote = try #require(row("providers", "provider", "remote", in: try await overview()))
            #expect(remote["limit"] as? Int == 2 && remote["limitSetLive"] as? Bool == true && remote["inFlight"] as? Int == 0)
            #expect(try await call(.put, "/admin/v1/providers/remote/concurrency", #"{"limit": null}"#).0 == .ok)
            #expect(row("providers", "provider", "remote", in: try await overview())?["limitSetLive"] as? Bool == false)

            // Drain the worker: a new job waits; undrained, it completes
            let encodedWorker = workerId.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? workerId
            #expect(try await call(.post, "/admin/v1/workers/\(encodedWorker)/drain").1["drainedWorkers"] as? [String] == [workerId])
            let held = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: alice, imageKey: key, effect: "copy"))
            try await waitUntil { (row("workers", "id", workerId, in: try await overview())?["drained"] as? Bool) == true }
            try await waitUntil { (row("effects", "effect", "copy", in: try await overview())?["queued"] as? Int) == 1 }
            #expect(try await call(.post, "/admin/v1/workers/\(encodedWorker)/undrain").0 == .ok)
            #expect(try await JobSystem.waitForStatus(client, as: alice, jobId: held)["status"] as? String == "completed")
            // The last hour counts what completed
            #expect(((try await overview())["lastHour"] as? [[String: Any]] ?? []).reduce(0) { $0 + ($1["completed"] as? Int ?? 0) } == 4)

            // Every change audited, once: a second pause of the same thing changes nothing
            #expect(try await call(.post, "/admin/v1/effects/grayscale/resume").0 == .ok)
            let audit = JobSystem.json(try await client.execute(uri: "/admin/v1/audit", method: .get, headers: viewer))["entries"] as? [[String: Any]] ?? []
            #expect(audit.map { $0["action"] as? String ?? "" } == [
                "dispatch.resume", "workers.undrain", "workers.drain", "dispatch.concurrency", "dispatch.concurrency", "dispatch.resume", "dispatch.pause",
                "dispatch.resume", "dispatch.pause",
            ])
            #expect(audit.first?["count"] as? Int == 0 && audit[1]["count"] as? Int == 1)
        }
        await system.stop()
    }
}
