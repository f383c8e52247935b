import Blobs
import Bus
import Foundation
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Messages
import QuotaService
import ServiceKit
import Synchronization
import Testing

@Suite("Jobs and workers, through the gateway", .serialized, .timeLimit(.minutes(5)))
struct JobsFlowTests {
    @Test func wholeFlowFromUploadToResultAndThumbnail() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            // Given an uploaded JPEG
            let key = try await JobSystem.upload(client, as: user)
            // When an upscale job is created
            let created = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "upscale", parameters: #"{"factor": 2}"#)
            #expect(created.status == .accepted)
            let jobId = try JobSystem.jobId(of: created)
            #expect(JobSystem.json(created)["status"] as? String == "queued")
            #expect(created.headers[.location] == "/api/v1/jobs/\(jobId)")
            // Then it completes, with a result twice the size and a 200x200 thumbnail
            let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
            #expect(status["status"] as? String == "completed")
            #expect(status["progress"] as? Double == 1)
            let resultURL = try #require(status["resultUrl"] as? String)
            let thumbnailURL = try #require(status["thumbnailUrl"] as? String)
            let result = try await client.execute(uri: JobSystem.path(resultURL), method: .get)
            #expect(result.status == .ok)
            #expect(try JobSystem.dimensions(of: Data(buffer: result.body)) == (1280, 960))
            let thumbnail = try await client.execute(uri: JobSystem.path(thumbnailURL), method: .get)
            #expect(thumbnail.headers[.contentType] == "image/jpeg")
            #expect(try JobSystem.dimensions(of: Data(buffer: thumbnail.body)) == (200, 200))
            // And the same through Server-Sent Events: the stream ends after the terminal state
            let second = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale")
            let secondId = try JobSystem.jobId(of: second)
            let events = try await client.execute(uri: "/api/v1/jobs/\(secondId)/events", method: .get, headers: user)
            #expect(events.headers[.contentType] == "text/event-stream")
            let stream = String(buffer: events.body)
            #expect(stream.contains("event: status"))
            #expect(stream.contains(#""status":"completed""#))
            #expect(stream.components(separatedBy: "\n\n").filter { $0.contains("data:") }.last?.contains("completed") == true)
            // And quota committed both charges
            let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: "device:\(user[.deviceId]!.lowercased())"))
            #expect(usage.status.daily.used == 2)
            try await waitUntil { try await system.clients.quota.call(Quota.usage, UserReference(userId: usage.status.userId)).charges.allSatisfy { $0.state == .committed } }
        }
        await system.stop()
    }

    @Test func twentyFirstJobOfTheDayIs429WithHeaders() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            for _ in 0..<20 {
                let response = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy")
                #expect(response.status == .accepted)
            }
            let denied = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy")
            #expect(denied.status == .tooManyRequests)
            #expect(denied.headers[.contentType] == "application/problem+json")
            #expect(Int(denied.headers[.retryAfter] ?? "") ?? 0 > 0)
            #expect(denied.headers[.init("RateLimit-Policy")!] == "\"daily\";q=20;w=86400, \"monthly\";q=600;w=2592000")
            #expect(denied.headers[.init("RateLimit")!]?.hasPrefix("\"daily\";r=0;t=") == true)
            #expect(JobSystem.json(denied)["violated-policies"] as? [String] == ["daily"])
        }
        await system.stop()
    }

    @Test func killedWorkersJobIsFinishedByAnotherAndChargedOnce() async throws {
        // (A killed worker's model call waits JOBS_LOST_WORKER_GRACE_S for it to come back,
        // 3 s here, before it runs again: WorkerLinkTests is the worker that does come back.)
        let system = try await JobSystem(workers: 2, jobs: ["JOBS_LOST_WORKER_GRACE_S": "3"])
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // Given a slow job running on one of two workers
            let created = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "slow-remote")
            let jobId = try JobSystem.jobId(of: created)
            _ = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, until: { $0["status"] as? String == "processing" })
            let holder = try #require(try await waitForValue { system.workers.first { $0.output.contains("job=\(jobId)") } })
            // When that worker is killed outright
            holder.signal(SIGKILL)
            // Then the other worker completes it within seconds, on a second attempt
            let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(20))
            #expect(status["status"] as? String == "completed")
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: jobId, userId: "device:\(user[.deviceId]!.lowercased())"))
            #expect(job.attempts == 2)
            // And the user is charged exactly once
            let userId = job.userId
            try await waitUntil { try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).charges.first?.state == .committed }
            let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
            #expect(usage.status.daily.used == 1)
            #expect(usage.charges.count == 1)
        }
        await system.stop()
    }

    @Test func failedAndCancelledJobsGiveTheChargeBack() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // A job whose effect fails for good
            let broken = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "broken-remote")
            let brokenId = try #require(JobSystem.json(broken)["jobId"] as? String, "the creation answered \(broken.status): \(String(buffer: broken.body))")
            let failed = try await JobSystem.waitForStatus(client, as: user, jobId: brokenId)
            #expect(failed["status"] as? String == "failed")
            #expect((failed["error"] as? String)?.contains("400") == true)
            // A processing job cancelled by the user: the worker stops it
            let slow = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "slow-remote")
            let slowId = try #require(JobSystem.json(slow)["jobId"] as? String, "the creation answered \(slow.status): \(String(buffer: slow.body))")
            _ = try await JobSystem.waitForStatus(client, as: user, jobId: slowId, until: { $0["status"] as? String == "processing" })
            let cancel = try await client.execute(uri: "/api/v1/jobs/\(slowId)/cancel", method: .post, headers: user)
            #expect(cancel.status == .ok)
            let cancelled = try await JobSystem.waitForStatus(client, as: user, jobId: slowId)
            #expect(cancelled["status"] as? String == "cancelled")
            // Both charges come back
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
                return usage.status.daily.used == 0 && usage.charges.allSatisfy { $0.state == .released }
            }
            // A finished job cannot be cancelled
            let again = try await client.execute(uri: "/api/v1/jobs/\(brokenId)/cancel", method: .post, headers: user)
            #expect(again.status == .conflict)
        }
        await system.stop()
    }

    @Test func reservationWithoutAJobIsReleasedAndACreationArrivingLaterIsRefused() async throws {
        // Stale after 1 s: no creation in this test goes through the gateway's reserve and create
        let system = try await JobSystem(workers: 0, quota: ["QUOTA_STALE_AFTER_S": "1"])
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        // The gateway died between reserve and create: a reservation with no job behind it
        let orphan = "orphan-\(UUID())"
        _ = try await system.clients.quota.call(Quota.reserve, ReserveQuota(userId: userId, jobId: orphan))
        try await waitUntil {
            try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).charges.first?.state == .released
        }
        #expect(try await system.clients.quota.call(Quota.status, UserReference(userId: userId)).daily.used == 0)
        // Its creation, arriving late (a lost request retried), is refused: the units were given back
        do {
            _ = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: orphan, userId: userId, isPro: false, imageKey: "uploads/x/late.jpg", effectId: "copy"))
            Issue.record("a creation after its reservation was given back was accepted")
        } catch {
            #expect(error.code == Jobs.ErrorCode.abandoned, "\(error)")
        }
        await system.stop()
    }

    @Test func anIdempotencyKeyChargesOnce() async throws {
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let first = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-1")
            let second = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-1")
            #expect(first.status == .accepted && second.status == .accepted)
            #expect(JobSystem.json(first)["jobId"] as? String == JobSystem.json(second)["jobId"] as? String)
            let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
            #expect(usage.status.daily.used == 1)
        }
        await system.stop()
    }

    @Test(arguments: [true, false])
    func anIdempotencyKeyPastItsWindowIsRefusedAndNeverChargesTwice(gatewayToo: Bool) async throws {
        // A window of two seconds for quota (which then forgets the charge), and for the gateway
        // too or not: a gateway left at its default day follows the window quota tells it
        let window = ["IDEMPOTENCY_WINDOW_S": "2"]
        let system = try await JobSystem(workers: 1, quota: window, gateway: gatewayToo ? window : [:])
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        try await system.gateway { client in
            // Given a job made with a key, completed
            let key = try await JobSystem.upload(client, as: user)
            let first = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-1")
            let jobId = try JobSystem.jobId(of: first)
            _ = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
            // When the same key is sent again once the window is past, before and after quota
            // has forgotten the charge
            var refused: TestResponse?
            try await waitUntil {
                let again = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-1")
                #expect(again.status == .accepted || again.status == .conflict, "\(again.status)")
                if again.status == .conflict { refused = again }
                return again.status == .conflict
            }
            try await waitUntil {
                let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
                return !usage.charges.contains { $0.jobId == jobId }
            }
            let afterForgetting = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-1")
            // Then each is refused with a problem naming the expired key, and the job was charged once
            for response in [try #require(refused), afterForgetting] {
                #expect(response.status == .conflict)
                #expect(JobSystem.json(response)["code"] as? String == "idempotency_key_expired")
            }
            let usage = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId))
            #expect(usage.status.daily.used == 1)
            // And a new key makes a new job
            let fresh = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy", idempotencyKey: "tap-2")
            #expect(fresh.status == .accepted)
            #expect(try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).status.daily.used == 2)
        }
        await system.stop()
    }

    @Test func aStaleReservationMadeLongAfterItsJobEndedIsReleasedNotCommitted() async throws {
        // The real jobs service answers about real jobs; the reservations are made in a ledger
        // of the test's own with the times the test gives (quota's clock, two minutes on)
        let system = try await JobSystem(workers: 1)
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        let made = Mutex<[String]>([])
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            for _ in 0..<2 {
                let jobId = try JobSystem.jobId(of: try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy"))
                _ = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
                made.withLock { $0.append(jobId) }
            }
        }
        let jobIds = made.withLock { $0 }
        let ledger = try QuotaDatabase.inMemory()
        // Given a reservation of a completed job's id made before it ended (its own charge, whose
        // commit was lost), and one made two minutes after the other ended (a forgotten id sent
        // again, refused by the gateway, whose give-back was lost)
        let now = Date()
        _ = try await ledger.reserve(ReserveQuota(userId: userId, jobId: jobIds[0]), now: now.addingTimeInterval(-600))
        _ = try await ledger.reserve(ReserveQuota(userId: userId, jobId: jobIds[1]), now: now.addingTimeInterval(120))
        _ = try await ledger.usage(userId: userId, now: now)  // (once the ledger's tables hold them)
        // When the resolver finds them stale
        var logger = Logger(label: "test.resolver")
        logger.logLevel = .warning
        let resolver = StaleReservationResolver(store: ledger, jobs: system.clients.jobs, staleAfter: .seconds(1), interval: .seconds(60), logger: logger)
        #expect(try await resolver.resolve(now: now.addingTimeInterval(300)) == 2)
        // Then the job's own charge is committed and the later one released
        let charges = try await ledger.usage(userId: userId, now: now).charges
        #expect(charges.first { $0.jobId == jobIds[0] }?.state == .committed)
        #expect(charges.first { $0.jobId == jobIds[1] }?.state == .released)
        await ledger.close()
        await system.stop()
    }

    @Test func burstOfOneUserDoesNotDelayAnotherUsersJob() async throws {
        // Given no worker yet, user A queues 100 jobs, then user B queues 1 (both pro)
        let system = try await JobSystem(workers: 0)
        let alice = JobSystem.guest(UUID()), bob = JobSystem.guest(UUID())
        for user in [alice, bob] {
            _ = try await system.clients.quota.call(Quota.setPlan, SetPlan(userId: "device:\(user[.deviceId]!.lowercased())", plan: "pro"))
        }
        try await system.gateway { client in
            let aliceKey = try await JobSystem.upload(client, as: alice)
            let bobKey = try await JobSystem.upload(client, as: bob)
            var aliceJobs: [String] = []
            for _ in 0..<100 {
                let response = try await JobSystem.createJob(client, as: alice, imageKey: aliceKey, effect: "copy")
                aliceJobs.append(try JobSystem.jobId(of: response))
            }
            let bobJob = try #require(JobSystem.json(try await JobSystem.createJob(client, as: bob, imageKey: bobKey, effect: "copy"))["jobId"] as? String)
            // When one worker starts taking them
            try system.startWorker()
            _ = try await JobSystem.waitForStatus(client, as: bob, jobId: bobJob)
            let tenth = try await JobSystem.waitForStatus(client, as: alice, jobId: aliceJobs[9], within: .seconds(60))
            #expect(tenth["status"] as? String == "completed")
            // Then B's job started before A's tenth
            let bobRecord = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: bobJob, userId: "device:\(bob[.deviceId]!.lowercased())"))
            let tenthRecord = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: aliceJobs[9], userId: "device:\(alice[.deviceId]!.lowercased())"))
            #expect(try #require(bobRecord.startedAt) < (try #require(tenthRecord.startedAt)))
        }
        await system.stop()
    }

    @Test func uploadsRefuseExpiredTamperedOversizedAndFakeImages() async throws {
        let system = try await JobSystem(workers: 0, uploadMaxBytes: 64 * 1024)
        let user = JobSystem.guest(UUID())
        let signer = URLSigner(secret: JobSystem.signingSecret)
        let owner = "device:\(user[.deviceId]!.lowercased())"
        @Sendable func put(_ key: String, expires: Int, sig: String? = nil, type: String = "image/jpeg", bytes: Data) -> (String, ByteBuffer) {
            let signature = sig ?? signer.signature(method: "PUT", key: key, owner: owner, contentType: type, expires: expires)
            let query = "owner=\(owner.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)&exp=\(expires)&sig=\(signature)"
            return ("/api/v1/uploads/\(key)?\(query)", ByteBuffer(bytes: bytes))
        }
        let jpeg = try Data(contentsOf: JobSystem.fixture)
        let now = Int(Date().timeIntervalSince1970)
        try await system.gateway { client in
            // Expired
            let (expiredURI, expiredBody) = put("uploads/x/expired.jpg", expires: now - 10, bytes: jpeg)
            #expect(try await client.execute(uri: expiredURI, method: .put, headers: [.contentType: "image/jpeg"], body: expiredBody).status == .forbidden)
            // Tampered signature
            let (tamperedURI, tamperedBody) = put("uploads/x/tampered.jpg", expires: now + 60, sig: "AAAA" + String(repeating: "b", count: 39), bytes: jpeg)
            #expect(try await client.execute(uri: tamperedURI, method: .put, headers: [.contentType: "image/jpeg"], body: tamperedBody).status == .forbidden)
            // Signed for another type than the one sent
            let (otherURI, otherBody) = put("uploads/x/other.jpg", expires: now + 60, type: "image/png", bytes: jpeg)
            #expect(try await client.execute(uri: otherURI, method: .put, headers: [.contentType: "image/jpeg"], body: otherBody).status == .forbidden)
            // Too large
            let (bigURI, bigBody) = put("uploads/x/big.jpg", expires: now + 60, bytes: jpeg + Data(count: 100_000))
            #expect(try await client.execute(uri: bigURI, method: .put, headers: [.contentType: "image/jpeg"], body: bigBody).status == .contentTooLarge)
            // Not really a JPEG
            let (fakeURI, fakeBody) = put("uploads/x/fake.jpg", expires: now + 60, bytes: Data("GIF89a this is not a jpeg".utf8))
            #expect(try await client.execute(uri: fakeURI, method: .put, headers: [.contentType: "image/jpeg"], body: fakeBody).status == .unsupportedMediaType)
            // A type that is not an image at all cannot even be presigned
            let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                   body: ByteBuffer(string: #"{"filename": "a.gif", "contentType": "image/gif"}"#))
            #expect(presign.status == .unsupportedMediaType)
            // Someone else's image key
            let key = try await JobSystem.upload(client, as: user)
            let stranger = JobSystem.guest(UUID())
            let stolen = try await JobSystem.createJob(client, as: stranger, imageKey: key, effect: "copy")
            #expect(stolen.status == .notFound)
            // Nothing was charged to the stranger
            let usage = try await system.clients.quota.call(Quota.status, UserReference(userId: "device:\(stranger[.deviceId]!.lowercased())"))
            #expect(usage.daily.used == 0)
        }
        await system.stop()
    }

    @Test func anotherUserGets404ForEveryRouteOfAJob() async throws {
        let system = try await JobSystem(workers: 1)
        let owner = JobSystem.guest(UUID()), stranger = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: owner)
            let jobId = try #require(JobSystem.json(try await JobSystem.createJob(client, as: owner, imageKey: key, effect: "copy"))["jobId"] as? String)
            let done = try await JobSystem.waitForStatus(client, as: owner, jobId: jobId)
            for (path, method) in [("", HTTPRequest.Method.get), ("/status", .get), ("/events", .get), ("/cancel", .post), ("/rerun", .post)] {
                let response = try await client.execute(uri: "/api/v1/jobs/\(jobId)\(path)", method: method, headers: stranger)
                #expect(response.status == .notFound, "\(method) \(path)")
            }
            #expect(try await client.execute(uri: "/api/v1/jobs/\(UUID())/status", method: .get, headers: owner).status == .notFound)
            // Result and thumbnail files need their signature: a guessed path is refused
            let result = try #require(done["resultUrl"] as? String)
            let unsigned = String(JobSystem.path(result).prefix { $0 != "?" })
            #expect(try await client.execute(uri: unsigned, method: .get, headers: stranger).status == .forbidden)
            // The owner can re-run it: a new job, charged
            let rerun = try await client.execute(uri: "/api/v1/jobs/\(jobId)/rerun", method: .post, headers: owner)
            #expect(rerun.status == .accepted)
            #expect(JobSystem.json(rerun)["jobId"] as? String != jobId)
        }
        await system.stop()
    }
}

/// Polls `condition` until it holds (at most `limit`), recording an issue if it never does.
func waitUntil(within limit: Duration = .seconds(60), _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now.advanced(by: limit)
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(100))
    }
    Issue.record("condition not met within \(limit)")
}

/// Polls `value` until it is not nil (at most `limit`).
func waitForValue<T>(within limit: Duration = .seconds(60), _ value: () throws -> T?) async throws -> T? {
    let deadline = ContinuousClock.now.advanced(by: limit)
    while ContinuousClock.now < deadline {
        if let found = try value() { return found }
        try await Task.sleep(for: .milliseconds(50))
    }
    return nil
}

@Suite("Job creation input", .serialized, .timeLimit(.minutes(5)))
struct JobInputTests {
    @Test func badJobRequestsAreRefusedAndRefunded() async throws {
        let system = try await JobSystem(workers: 0)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // The catalogue the app shows: ids, titles, parameter schemas, nothing of the operator's
            let catalogue = JobSystem.json(try await client.execute(uri: "/api/v1/effects", method: .get))
            let effects = try #require(catalogue["effects"] as? [[String: Any]])
            let enhance = try #require(effects.first { $0["id"] as? String == "auto-enhance" })
            #expect((enhance["parameters"] as? [[String: Any]])?.compactMap { $0["name"] as? String } == ["fidelity", "upscale"])
            #expect(effects.contains { $0["id"] as? String == "slow-remote" && $0["endpoint"] == nil && $0["processor"] == nil })
            let unknown = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "teleport")
            #expect(unknown.status == .unprocessableContent)
            let outOfRange = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "blur", parameters: #"{"sigma": 9000}"#)
            #expect(outOfRange.status == .unprocessableContent)
            let wrongType = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: #"{"imageKey": 5}"#))
            #expect(wrongType.status == .badRequest)
            let garbage = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: "{{{"))
            #expect(garbage.status == .badRequest)
            // No effect named (both fields are optional in the document): the default
            let noEffect = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: #"{"imageKey": "\#(key)"}"#))
            #expect(noEffect.status == .accepted)
            // The seeds' older name for the default effect still works
            let legacy = try await client.execute(uri: "/api/v1/jobs", method: .post, headers: user, body: ByteBuffer(string: #"{"imageKey": "\#(key)", "model": "default"}"#))
            #expect(legacy.status == .accepted)
            // Only the accepted jobs are charged: the refused ones were released
            try await waitUntil {
                try await system.clients.quota.call(Quota.status, UserReference(userId: "device:\(user[.deviceId]!.lowercased())")).daily.used == 2
            }
        }
        await system.stop()
    }
}
