import AsyncHTTPClient
import Blobs
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import Synchronization
import Testing
@testable import WorkerKit
import NIOHTTP1

/// Real models through the gateway, with real processes: effects priced in credits, run by the
/// providers' adapters against `provider-fixture`, a local server that answers in Gemini's,
/// OpenAI's and fal's documented shapes and checks what it is sent as they would (its
/// `rejected` list must stay empty). Long fal generations hold no worker slot.
@Suite("Models, providers and credits", .serialized, .timeLimit(.minutes(5)))
struct ModelProvidersTests {
    static let keys = (gemini: "sk-gemini-SECRET-4711", openai: "sk-openai-SECRET-4712", fal: "fal-SECRET-4713")

    /// The fixture process and the job system its models point at.
    final class ModelSystem: @unchecked Sendable {
        // @unchecked: driven by one test at a time.
        let fixture: ServiceProcess
        let fixturePort = freePort()
        let system: JobSystem
        var fixtureBase: String { "http://127.0.0.1:\(fixturePort)" }

        init(videoMilliseconds: Int = 1500, imageMilliseconds: Int = 50, pollMilliseconds: Int = 1000, workers: Int = 2, capacity: Int = 4,
             plans: String? = nil, limits: String? = nil, maxAttempts: Int = 3) async throws {
            fixture = try ServiceProcess("provider-fixture", environment: [
                "FIXTURE_PORT": "\(fixturePort)", "FIXTURE_VIDEO_MS": "\(videoMilliseconds)", "FIXTURE_IMAGE_MS": "\(imageMilliseconds)",
                "FIXTURE_GEMINI_KEY": keys.gemini, "FIXTURE_OPENAI_KEY": keys.openai, "FIXTURE_FAL_KEY": keys.fal,
            ])
            let base = "http://127.0.0.1:\(fixturePort)"
            try await waitUntil(within: .seconds(30)) {
                (try? await HTTPClient.shared.execute(HTTPClientRequest(url: base + "/_fixture/stats"), timeout: .seconds(2)))?.status == .ok
            }
            let effects = """
                [{"id": "nano-banana", "title": "Nano Banana", "processor": "gemini", "model": "gemini-2.5-flash-image", "credits": 4, "endpoint": "\(base)"},
                 {"id": "gpt-edit", "title": "GPT Image", "processor": "openai", "model": "gpt-image-1", "credits": 3, "endpoint": "\(base)"},
                 {"id": "veo", "title": "FalAI Veo 3.1", "processor": "fal", "model": "fal-ai/veo3.1/image-to-video", "kind": "video", "credits": 4, "endpoint": "\(base)"},
                 {"id": "impatient", "title": "Impatient", "processor": "gemini", "model": "gemini-2.5-flash-image", "credits": 2, "timeoutSeconds": 1, "endpoint": "\(base)"},
                 {"id": "veo-impatient", "title": "Impatient video", "processor": "fal", "model": "fal-ai/veo3.1/image-to-video", "kind": "video", "credits": 4, "timeoutSeconds": 3, "endpoint": "\(base)"}]
                """
            var jobs = ["JOBS_EFFECTS": effects, "JOBS_MAX_ATTEMPTS": "\(maxAttempts)"]
            if let limits { jobs["JOBS_PROVIDER_CONCURRENCY"] = limits }
            system = try await JobSystem(workers: 0, quota: plans.map { ["QUOTA_PLANS": $0] } ?? [:], jobs: jobs,
                                         gateway: ["FAL_WEBHOOK_JWKS_URL": base + "/.well-known/jwks.json"])
            for _ in 0..<workers {
                try system.startWorker(capacity: capacity, extra: [
                    "GEMINI_API_KEY": keys.gemini, "OPENAI_API_KEY": keys.openai, "FAL_KEY": keys.fal, "WORKER_POLL_MS": "\(pollMilliseconds)",
                    "WORKER_PREFETCH": "0",
                ])
            }
        }

        /// What the fixture saw.
        func stats() async throws -> [String: Any] {
            let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: fixtureBase + "/_fixture/stats"), timeout: .seconds(5))
            let body = try await response.body.collect(upTo: 1 << 20)
            return (try JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any]) ?? [:]
        }

        /// Every line the processes wrote (services, workers, the gateway replica, the fixture).
        func logs() throws -> String {
            let processes = Array(system.services.processes.values) + system.workers + [system.replica, fixture].compactMap { $0 }
            return try processes.map { try String(contentsOf: $0.logURL, encoding: .utf8) }.joined(separator: "\n")
        }

        func stop() async {
            await system.stop()
            await fixture.stop()
        }
    }

    static func fetch(_ url: String) async throws -> (Int, String, Data) {
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(10))
        let body = try await response.body.collect(upTo: 32 << 20)
        return (Int(response.status.code), response.headers.first(name: "Content-Type") ?? "", Data(buffer: body))
    }

    /// The credits left today, as the app reads them.
    static func dailyRemaining(_ client: any TestClientProtocol, _ user: HTTPFields) async throws -> Int? {
        let credits = try await client.execute(uri: "/api/v1/users/me/credits", method: .get, headers: user)
        return JobSystem.json(credits)["dailyRemaining"] as? Int
    }

    static func create(_ client: any TestClientProtocol, _ user: HTTPFields, key: String, effect: String, prompt: String) async throws -> (HTTPResponse.Status, [String: Any]) {
        let response = try await JobSystem.createJob(client, as: user, imageKey: key, effect: effect, prompt: prompt)
        return (response.status, JobSystem.json(response))
    }

    @Test func geminiOpenAIAndFalEditsCompleteWithStoredResultsAndNoKeyLeaks() async throws {
        let models = try await ModelSystem(videoMilliseconds: 1500, pollMilliseconds: 20_000)
        let device = UUID()
        let user = JobSystem.guest(device)
        try await models.system.gateway { client in
            // The catalogue shows prices and kinds, never a processor, model, endpoint or key
            let listing = try await client.execute(uri: "/api/v1/effects", method: .get, headers: user)
            let listed = String(buffer: listing.body)
            let effects = try #require(JobSystem.json(listing)["effects"] as? [[String: Any]])
            let veo = try #require(effects.first { $0["id"] as? String == "veo" })
            #expect(veo["credits"] as? Int == 4 && veo["kind"] as? String == "video")
            #expect(effects.first { $0["id"] as? String == "grayscale" }?["credits"] as? Int == 1)
            #expect(!listed.contains("endpoint") && !listed.contains("SECRET") && !listed.contains("processor"))

            let key = try await JobSystem.upload(client, as: user)
            var jobs: [String: String] = [:]
            for (effect, prompt) in [("nano-banana", "make it a watercolour"), ("gpt-edit", "add a hat"), ("veo", "make it move"),
                                     ("veo", "twicehook pan slowly")] {
                let (status, body) = try await Self.create(client, user, key: key, effect: effect, prompt: prompt)
                #expect(status == .accepted, "\(effect): \(body)")
                jobs[prompt] = try #require(body["jobId"] as? String)
            }
            for (prompt, jobId) in jobs {
                // fal's webhook is the fast path: the workers poll only every 20 s, so the videos
                // complete within this wait only because the webhook came.
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(15))
                #expect(status["status"] as? String == "completed", "\(prompt): \(status)")
            }
            // Images: a JPEG result and thumbnail
            for prompt in ["make it a watercolour", "add a hat"] {
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobs[prompt]!)
                let (code, type, bytes) = try await Self.fetch(try #require(status["resultUrl"] as? String))
                #expect(code == 200 && type == "image/jpeg" && ImageSniffer.contentType(of: Array(bytes.prefix(16))) == "image/jpeg")
            }
            // The video: an MP4, and its first frame as the thumbnail
            let video = try await JobSystem.waitForStatus(client, as: user, jobId: jobs["make it move"]!)
            let (code, type, bytes) = try await Self.fetch(try #require(video["resultUrl"] as? String))
            #expect(code == 200 && type == "video/mp4" && bytes.count > 1000 && String(decoding: bytes[4..<8], as: UTF8.self) == "ftyp")
            let (_, _, thumbnail) = try await Self.fetch(try #require(video["thumbnailUrl"] as? String))
            #expect(ImageSniffer.contentType(of: Array(thumbnail.prefix(16))) == "image/jpeg")
            let (width, height) = try JobSystem.dimensions(of: thumbnail)
            #expect(width == 200 && height == 200, "the 320x240 video's first frame, centre-cropped as every thumbnail: \(width)x\(height)")

            // History and the older route: the real credits, and video_url pointing at the MP4
            try await waitUntil {
                let legacy = try await client.execute(uri: "/get-video-jobs?device_id=\(device.uuidString)", method: .get, headers: user)
                let listed = (JobSystem.json(legacy)["jobs"] as? [[String: Any]]) ?? []
                let entry = listed.first { $0["job_id"] as? String == jobs["make it move"] }
                return entry?["credits_used"] as? Int == 4 && (entry?["video_url"] as? String)?.isEmpty == false
                    && listed.first { $0["job_id"] as? String == jobs["add a hat"] }?["credits_used"] as? Int == 3
            }
            let item = try await client.execute(uri: "/api/v1/history/\(jobs["make it a watercolour"]!)", method: .get, headers: user)
            #expect(JobSystem.json(item)["credits"] as? Int == 4)

            // Charged once each, the webhook that came twice included: 4 + 3 + 4 + 4 of 20
            try await waitUntil { try await Self.dailyRemaining(client, user) == 20 - 15 }
            let stats = try await models.stats()
            #expect((stats["rejected"] as? [String])?.isEmpty == true, "\(stats["rejected"] ?? "")")
            #expect(stats["submissions"] as? Int == 2, "one submission per video job")
            #expect((stats["webhooksSent"] as? Int ?? 0) >= 3)
            #expect(stats["webhookFailures"] as? Int == 0, "every signed webhook of fal's was taken")

            // A forged webhook (the URL's signature not ours) answers 401 and changes nothing;
            // so does one at a URL of ours without fal's signature
            var forged = HTTPClientRequest(url: "\(models.system.publicBase)/api/v1/providers/fal/webhook?job=\(jobs["make it move"]!)&exp=9999999999&sig=forged")
            forged.method = .POST
            forged.body = .bytes(ByteBuffer(string: #"{"request_id": "x", "status": "OK", "payload": {"video": {"url": "http://evil/x.mp4"}}}"#))
            #expect(try await HTTPClient.shared.execute(forged, timeout: .seconds(5)).status == .unauthorized)
            let signer = WebhookSigner(secret: JobSystem.signingSecret, publicBaseURL: models.system.publicBase)
            var unsigned = HTTPClientRequest(url: signer.url(provider: "fal", jobId: jobs["make it move"]!))
            unsigned.method = .POST
            unsigned.body = forged.body
            #expect(try await HTTPClient.shared.execute(unsigned, timeout: .seconds(5)).status == .unauthorized)
            let after = try await JobSystem.waitForStatus(client, as: user, jobId: jobs["make it move"]!)
            #expect(after["resultUrl"] as? String != nil && after["status"] as? String == "completed")

            // A job whose webhook never comes completes by polling (every 20 s here)
            let (status, body) = try await Self.create(client, user, key: key, effect: "veo", prompt: "nowebhook drift")
            #expect(status == .accepted)
            let polled = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(body["jobId"] as? String), within: .seconds(60))
            #expect(polled["status"] as? String == "completed", "\(polled)")
        }
        // No key in any process's log
        let logs = try models.logs()
        for key in [Self.keys.gemini, Self.keys.openai, Self.keys.fal] { #expect(!logs.contains(key)) }
        await models.stop()
    }

    @Test func creditsAreReservedAtThePriceAndGivenBackOnARefusal() async throws {
        let models = try await ModelSystem(plans: #"{"free": {"daily": 5, "monthly": 600}, "twenty": {"daily": 20, "monthly": 600}}"#)
        let user = JobSystem.guest(UUID())
        try await models.system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // A safety refusal of each provider (Gemini's blocked prompt, OpenAI's
            // moderation_blocked, fal's content_policy_violation) fails at once, not retried,
            // says so, and gives all the credits back
            for effect in ["nano-banana", "gpt-edit", "veo"] {
                let (refusedStatus, refusedBody) = try await Self.create(client, user, key: key, effect: effect, prompt: "something unsafe")
                #expect(refusedStatus == .accepted)
                let refusedId = try #require(refusedBody["jobId"] as? String)
                let refused = try await JobSystem.waitForStatus(client, as: user, jobId: refusedId)
                #expect(refused["status"] as? String == "failed" && refused["error"] as? String == "The model declined this edit.", "\(effect): \(refused)")
                let job = try await client.execute(uri: "/api/v1/jobs/\(refusedId)", method: .get, headers: user)
                #expect(JobSystem.json(job)["attempts"] as? Int == 1, "a refusal is not retried")
                try await waitUntil { try await Self.dailyRemaining(client, user) == 5 }
            }
            // The operators' overview counts each provider's refusals, from the workers' metrics
            try await waitUntil {
                let overview = JobSystem.json(try await client.execute(uri: "/admin/v1/overview", method: .get, headers: [.authorization: "Bearer \(JobSystem.adminToken)"]))
                let providers = overview["providers"] as? [[String: Any]] ?? []
                return ["gemini", "openai", "fal"].allSatisfy { name in (providers.first { $0["provider"] as? String == name }?["refusals"] as? Int ?? 0) == 1 }
            }
            // 5 left: a 4-credit job is admitted, the next refused naming 4 needed and 1 left
            let (firstStatus, first) = try await Self.create(client, user, key: key, effect: "veo", prompt: "wave")
            #expect(firstStatus == .accepted)
            let second = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "nano-banana", prompt: "again")
            #expect(second.status == .tooManyRequests)
            let problem = JobSystem.json(second)
            #expect(problem["creditsNeeded"] as? Int == 4 && problem["creditsRemaining"] as? Int == 1, "\(problem)")
            let done = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(first["jobId"] as? String))
            #expect(done["status"] as? String == "completed")
        }
        // 100 concurrent 4-credit creates for a user with 20 credits admit exactly 5
        let rich = UUID()
        let richUser = JobSystem.guest(rich)
        try await models.system.gateway { client in
            let admin: HTTPFields = [.authorization: "Bearer \(JobSystem.adminToken)", .contentType: "application/json"]
            let plan = try await client.execute(uri: "/admin/v1/users/device:\(rich.uuidString.lowercased())/plan", method: .put, headers: admin,
                                                body: ByteBuffer(string: #"{"plan": "twenty"}"#))
            #expect(plan.status == .ok)
            let key = try await JobSystem.upload(client, as: richUser)
            let statuses = try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for index in 0..<100 {
                    group.addTask {
                        try await JobSystem.createJob(client, as: richUser, imageKey: key, effect: "nano-banana", prompt: "burst \(index)").status
                    }
                }
                return try await group.reduce(into: [HTTPResponse.Status]()) { $0.append($1) }
            }
            #expect(statuses.filter { $0 == .accepted }.count == 5, "\(statuses.filter { $0 == .accepted }.count) admitted")
            #expect(statuses.filter { $0 == .tooManyRequests }.count == 95)
        }
        let stats = try await models.stats()
        #expect((stats["rejected"] as? [String])?.isEmpty == true, "\(stats["rejected"] ?? "")")
        await models.stop()
    }

    @Test func rateLimitWaitsUseNoAttemptAndTheConcurrencyLimitHolds() async throws {
        // One attempt only: the job can complete only if the 429 waits did not use it up.
        let models = try await ModelSystem(imageMilliseconds: 800, plans: #"{"free": {"daily": 100, "monthly": 600}}"#,
                                           limits: #"{"gemini": 2}"#, maxAttempts: 1)
        let user = JobSystem.guest(UUID())
        try await models.system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            var ids: [String] = []
            for index in 0..<6 {
                // The rate-limited job last: the first portraits take both of gemini's places at
                // once, while the rate-limited one waits out its 429s (7.5 s) in one place.
                let prompt = index == 5 ? "ratelimit \(UUID().uuidString)" : "portrait \(index)"
                let (status, body) = try await Self.create(client, user, key: key, effect: "nano-banana", prompt: prompt)
                #expect(status == .accepted)
                ids.append(try #require(body["jobId"] as? String))
            }
            for id in ids {
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: id, within: .seconds(60))
                #expect(status["status"] as? String == "completed", "\(status)")
            }
            let job = try await client.execute(uri: "/api/v1/jobs/\(ids[5])", method: .get, headers: user)
            #expect(JobSystem.json(job)["attempts"] as? Int == 1)

            // A model with a 1 s timeout whose provider asks for 2.5 s: the attempt fails at once
            // as retryable, since the wait would pass its timeout (here its only attempt), and the
            // credits go back
            let (status, body) = try await Self.create(client, user, key: key, effect: "impatient", prompt: "ratelimit \(UUID().uuidString)")
            #expect(status == .accepted)
            let timedOut = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(body["jobId"] as? String))
            #expect(timedOut["status"] as? String == "failed" && (timedOut["error"] as? String)?.contains("past the model's timeout of 1 s") == true, "\(timedOut)")
            try await waitUntil { try await Self.dailyRemaining(client, user) == 100 - 6 * 4 }
        }
        let stats = try await models.stats()
        let most = (stats["maxInFlight"] as? [String: Int])?["gemini"] ?? 0
        // 8 worker slots and 6 jobs: only the limit keeps the provider at 2 at once.
        #expect(most == 2, "the most gemini requests at once: \(most)")
        #expect((stats["rateLimited"] as? [String: Int])?.values.contains(3) == true)
        #expect((stats["rejected"] as? [String])?.isEmpty == true)
        await models.stop()
    }

    @Test func anImageModelsSlotGoesToTheNextJobOnceTheModelAnswered() async throws {
        // Given one worker of capacity 1 that prefetches nothing, a model that takes 1 s, and
        // two jobs
        let models = try await ModelSystem(imageMilliseconds: 1000, workers: 1, capacity: 1)
        let guest = JobSystem.guest(UUID())
        let ids = Mutex<[String]>([])
        try await models.system.gateway { client in
            let key = try await JobSystem.upload(client, as: guest)
            for index in 0..<2 {
                let (status, body) = try await Self.create(client, guest, key: key, effect: "nano-banana", prompt: "edit \(index)")
                #expect(status == .accepted)
                try ids.withLock { $0.append(try #require(body["jobId"] as? String)) }
            }
        }
        let (first, second) = ids.withLock { ($0[0], $0[1]) }
        let user = JobSystem.userId(ofGuest: guest)
        func status(_ id: String) async throws -> JobStatus {
            try await models.system.clients.jobs.call(Jobs.get, JobReference(jobId: id, userId: user)).status
        }
        // When the first is at the model, and the gateway its result is written through is paused
        try await waitUntil { ((try await models.stats())["inFlight"] as? [String: Int])?["gemini"] == 1 }
        let store = try #require(models.system.replica)
        store.signal(SIGSTOP)
        // Then once the model answered, the second job has the slot while the first is still
        // writing its result (before, the slot was held until the result was recorded)
        try await waitUntil(within: .seconds(10)) {
            let (one, two) = (try await status(first), try await status(second))
            return one == .processing && two == .processing
        }
        // And both complete once the writes go through
        store.signal(SIGCONT)
        try await waitUntil(within: .seconds(20)) {
            let (one, two) = (try await status(first), try await status(second))
            return one == .completed && two == .completed
        }
        #expect(((try await models.stats())["maxInFlight"] as? [String: Int])?["gemini"] == 1)
        await models.stop()
    }

    /// An attempt given up at its timeout is let go at the provider before the next attempt
    /// starts: fal's generation is cancelled and its status asked until it ended; a direct
    /// request's connection is closed (the fixture stops a generation whose caller hung up, as a
    /// provider does). So the provider never holds two generations of one job, and the per-provider
    /// limit of 1 holds at the provider itself. The worker's gauges tell its places held from the
    /// generations waiting at fal without one.
    @Test func aTimedOutGenerationIsLetGoBeforeTheNextAttemptStarts() async throws {
        let models = try await ModelSystem(videoMilliseconds: 60_000, imageMilliseconds: 8_000, pollMilliseconds: 300, workers: 1, capacity: 1,
                                           limits: #"{"fal": 1, "gemini": 1}"#, maxAttempts: 2)
        let user = JobSystem.guest(UUID())
        try await models.system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            // A video waiting at fal holds no place: the gauges say so
            let (longStatus, long) = try await Self.create(client, user, key: key, effect: "veo", prompt: "nowebhook long")
            #expect(longStatus == .accepted)
            try await waitUntil { (try await models.stats())["submissions"] as? Int == 1 }
            try await waitUntil(within: .seconds(30)) {
                let metrics = try await MetricsTests.scrape(port: models.system.gatewayPort).exposition
                return metrics.sum("worker_generations_waiting", ["service": "worker"]) == 1 && metrics.sum("worker_jobs_in_progress", ["service": "worker"]) == 0
            }
            _ = try await client.execute(uri: "/api/v1/jobs/\(try #require(long["jobId"] as? String))/cancel", method: .post, headers: user)
            try await waitUntil { (try await models.stats())["cancels"] as? Int == 1 }

            // A video past its 3 s: cancelled at fal before the second attempt submits
            let (videoStatus, video) = try await Self.create(client, user, key: key, effect: "veo-impatient", prompt: "nowebhook slow")
            #expect(videoStatus == .accepted)
            let videoEnd = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(video["jobId"] as? String), within: .seconds(60))
            #expect(videoEnd["status"] as? String == "failed", "\(videoEnd)")
            var stats = try await models.stats()
            #expect(stats["submissions"] as? Int == 3 && stats["cancels"] as? Int == 3, "\(stats)")
            #expect(stats["maxFalRequestsWaiting"] as? Int == 1, "fal held two generations at once: \(stats)")

            // An image model past its 1 s: the connection is closed before the second attempt
            let (imageStatus, image) = try await Self.create(client, user, key: key, effect: "impatient", prompt: "slow portrait")
            #expect(imageStatus == .accepted)
            let imageEnd = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(image["jobId"] as? String), within: .seconds(60))
            #expect(imageEnd["status"] as? String == "failed", "\(imageEnd)")
            stats = try await models.stats()
            #expect(stats["abandoned"] as? Int == 2, "\(stats)")
            #expect((stats["maxInFlight"] as? [String: Int])?["gemini"] == 1, "gemini held two generations at once: \(stats)")
            #expect((stats["rejected"] as? [String])?.isEmpty == true, "\(stats["rejected"] ?? "")")
            // Every credit back: nothing was made
            try await waitUntil { try await Self.dailyRemaining(client, user) == 20 }
        }
        await models.stop()
    }

    @Test func aVideoSurvivesKillsOfJobsAndOfItsWorkerChargedOnce() async throws {
        let models = try await ModelSystem(videoMilliseconds: 10_000, pollMilliseconds: 500, workers: 1, capacity: 1)
        let device = UUID()
        let user = JobSystem.guest(device)
        try await models.system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            let (status, body) = try await Self.create(client, user, key: key, effect: "veo", prompt: "nowebhook sunrise")
            #expect(status == .accepted)
            let jobId = try #require(body["jobId"] as? String)
            try await waitUntil { (try await models.stats())["submissions"] as? Int == 1 }
            // Its generation waits at fal and holds no slot: a filter runs on the one slot meanwhile,
            // done while the video is still at fal (its 10 s there, not a bound on the filter's own
            // time, is what a busy machine must stay within: it once had 4 s)
            let (quickStatus, quick) = try await Self.create(client, user, key: key, effect: "grayscale", prompt: "quick")
            #expect(quickStatus == .accepted)
            let quickDone = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(quick["jobId"] as? String))
            #expect(quickDone["status"] as? String == "completed", "\(quickDone)")
            #expect((try await models.stats())["falRequestsWaiting"] as? Int == 1, "the filter ended after the video's generation")
            // kill -9 of jobs and of the worker while the video is generated
            models.system.services.processes[.jobs]?.signal(SIGKILL)
            models.system.workers.last?.signal(SIGKILL)
            _ = try await models.system.services.processes[.jobs]?.waitForExit()
            try models.system.services.restart(.jobs)
            _ = try await waitUntilHealthy(models.system.clients.jobs)
            try models.system.startWorker(capacity: 1, extra: [
                "GEMINI_API_KEY": Self.keys.gemini, "OPENAI_API_KEY": Self.keys.openai, "FAL_KEY": Self.keys.fal, "WORKER_POLL_MS": "500",
            ])
            let done = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(60))
            #expect(done["status"] as? String == "completed", "\(done)")
            // Submitted once at the provider, and charged once: 4 + 1 of the day's 20
            let stats = try await models.stats()
            #expect(stats["submissions"] as? Int == 1)
            try await waitUntil { try await Self.dailyRemaining(client, user) == 20 - 5 }

            // A video the user cancels while it generates is cancelled at fal too, credits back
            let (cancelStatus, cancelBody) = try await Self.create(client, user, key: key, effect: "veo", prompt: "nowebhook long")
            #expect(cancelStatus == .accepted)
            let cancelId = try #require(cancelBody["jobId"] as? String)
            try await waitUntil { (try await models.stats())["submissions"] as? Int == 2 }
            try await waitUntil { try await Self.dailyRemaining(client, user) == 20 - 5 - 4 }
            let cancelled = try await client.execute(uri: "/api/v1/jobs/\(cancelId)/cancel", method: .post, headers: user)
            #expect(cancelled.status == .ok)
            let ended = try await JobSystem.waitForStatus(client, as: user, jobId: cancelId)
            #expect(ended["status"] as? String == "cancelled", "\(ended)")
            try await waitUntil { (try await models.stats())["cancels"] as? Int == 1 }
            try await waitUntil { try await Self.dailyRemaining(client, user) == 20 - 5 }
        }
        await models.stop()
    }
}

/// The pieces of the adapters that need no server: how a provider's wait is read.
@Suite("Provider calls", .timeLimit(.minutes(5)))
struct ProviderCallTests {
    @Test func retryAfterIsReadInSecondsAsADateOrInMilliseconds() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        var headers = HTTPHeaders()
        #expect(ProviderCall.retryAfter(headers, now: now) == nil)
        headers.replaceOrAdd(name: "Retry-After", value: "2")
        #expect(ProviderCall.retryAfter(headers, now: now) == .seconds(2))
        // An HTTP date (RFC 9110), 30 s after now
        headers.replaceOrAdd(name: "Retry-After", value: "Fri, 15 Jan 2027 08:00:30 GMT")
        #expect(ProviderCall.retryAfter(headers, now: now) == .seconds(30))
        // OpenAI's milliseconds win; an absurd wait is capped at ten minutes
        headers.replaceOrAdd(name: "retry-after-ms", value: "1500")
        #expect(ProviderCall.retryAfter(headers, now: now) == .milliseconds(1500))
        headers.remove(name: "retry-after-ms")
        headers.replaceOrAdd(name: "Retry-After", value: "86400")
        #expect(ProviderCall.retryAfter(headers, now: now) == .seconds(600))
    }

    @Test func aProvidersErrorMessageIsShortAndAKeyRefusalNeverQuotesIt() {
        let call = ProviderCall(provider: "openai", model: "gpt-image-1", timeout: .seconds(10))
        let body = Data(#"{"error": {"message": "Incorrect API key provided: sk-abc***xyz.", "type": "invalid_request_error", "code": "invalid_api_key"}}"#.utf8)
        let refused = call.failure(.init(status: 401, headers: [:], body: body))
        #expect(!refused.retryable && !refused.description.contains("sk-abc") && refused.description.contains("401"))
        let malformed = call.failure(.init(status: 400, headers: [:], body: Data(#"{"error": {"message": "Invalid image."}}"#.utf8)))
        #expect(malformed.description.contains("Invalid image.") && !malformed.retryable)
    }
}

/// Each provider's own signals in its error answers, read as its documentation defines them
/// (`ProviderSignal` quotes the pages): the bodies below are the documented shapes.
@Suite("Provider signals", .timeLimit(.minutes(5)))
struct ProviderSignalTests {
    static func read(_ status: Int, _ body: String) -> ProviderSignal { ProviderSignal.read(status: status, body: Data(body.utf8)) }

    @Test func eachProvidersKeyBillingAndWaitSignalsAreRead() {
        // Gemini: an unknown key is a 400 INVALID_ARGUMENT with an ErrorInfo reason, not 401/403.
        let geminiKey = Self.read(400, #"{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]}}"#)
        #expect(geminiKey == ProviderSignal(kind: .key, message: "API key not valid. Please pass a valid API key."))
        // Gemini: a 429's wait is a RetryInfo detail (a protobuf Duration), never a header.
        let geminiWait = Self.read(429, #"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []}, {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37.5s"}]}}"#)
        #expect(geminiWait == ProviderSignal(retryDelay: .milliseconds(37_500), message: "quota"))
        #expect(Self.read(403, #"{"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "x", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "BILLING_DISABLED"}]}}"#).kind == .billing)
        // OpenAI: a 429 is a rate limit or the account out of money, told apart by type and code.
        #expect(Self.read(429, #"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}"#).kind == .billing)
        #expect(Self.read(429, #"{"error": {"message": "x", "type": "insufficient_quota", "param": null, "code": "project_spend_limit_exceeded"}}"#).kind == .billing)
        #expect(Self.read(429, #"{"error": {"message": "Rate limit reached for images per minute.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}"#) == ProviderSignal(message: "Rate limit reached for images per minute."))
        #expect(Self.read(400, #"{"error": {"message": "Billing hard limit has been reached", "type": "invalid_request_error", "param": null, "code": "billing_hard_limit_reached"}}"#).kind == .billing)
        #expect(Self.read(401, #"{"error": {"message": "Incorrect API key provided: sk-abc***xyz.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}"#).kind == .key)
        // fal: a locked account is a 403 that is billing, not the key.
        #expect(Self.read(403, #"{"detail": "User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing."}"#).kind == .billing)
        #expect(Self.read(401, #"{"detail": "Unauthorized"}"#) == ProviderSignal(kind: .key, message: "Unauthorized"))
        // The message is shortened, and fal's detail as a list (a validation error) is no message
        #expect(Self.read(500, #"{"error": {"message": "\#(String(repeating: "x", count: 500))"}}"#).message?.count == 200)
        #expect(Self.read(422, #"{"detail": [{"loc": ["body", "prompt"], "msg": "field required", "type": "value_error.missing"}]}"#).message == nil)
        // A plain 5xx or garbage says nothing beyond its status.
        #expect(Self.read(503, "<html>busy</html>") == ProviderSignal())
        #expect(ProviderSignal.duration("0.5s") == .milliseconds(500) && ProviderSignal.duration("5") == nil && ProviderSignal.duration("-1s") == nil)
    }

    /// The adapters against `provider-fixture`, which answers as each provider documents.
    @Test func keyAndBillingFailAtOnceForTheOperatorAndAnAdvisedWaitIsKept() async throws {
        let port = freePort()
        let fixture = try ServiceProcess("provider-fixture", environment: [
            "FIXTURE_PORT": "\(port)", "FIXTURE_IMAGE_MS": "10", "FIXTURE_VIDEO_MS": "300", "FIXTURE_GEMINI_KEY": "gemini-right",
            "FIXTURE_OPENAI_KEY": "openai-right", "FIXTURE_FAL_KEY": "fal-right",
        ])
        let base = "http://127.0.0.1:\(port)"
        func stats() async throws -> [String: Any] {
            let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: base + "/_fixture/stats"), timeout: .seconds(5))
            return (try JSONSerialization.jsonObject(with: Data(buffer: try await response.body.collect(upTo: 1 << 20))) as? [String: Any]) ?? [:]
        }
        try await waitUntil(within: .seconds(30)) { (try? await stats()) != nil }
        let image = try Data(contentsOf: JobSystem.fixture)
        func call(_ provider: String, _ model: String) -> ProviderCall { ProviderCall(provider: provider, model: model, timeout: .seconds(60)) }

        // Gemini's 400 API_KEY_INVALID: the key, for good, in the operator's words, not Gemini's.
        do {
            _ = try await GeminiAdapter(baseURL: base, key: "gemini-wrong").edit(image, contentType: "image/jpeg", prompt: "a hat", call: call("gemini", "gemini-2.5-flash-image"))
            Issue.record("a wrong Gemini key was accepted")
        } catch let error as EffectError {
            #expect(!error.retryable && error.description.contains("refused our API key (400)") && !error.description.contains("not valid"), "\(error)")
        }
        // OpenAI's 429 insufficient_quota: billing, after one request, not retried as a rate limit.
        do {
            _ = try await OpenAIAdapter(baseURL: base, key: "openai-right").edit(image, contentType: "image/jpeg", prompt: "nocredit hat", call: call("openai", "gpt-image-1"))
            Issue.record("OpenAI's insufficient_quota was not a failure")
        } catch let error as EffectError {
            #expect(!error.retryable && error.description.contains("refused for billing (429"), "\(error)")
        }
        // fal's 403 "User is locked. Reason: Exhausted balance.": billing, not the key.
        do {
            _ = try await FalAdapter(queueURL: base, key: "fal-right").submit(image, contentType: "image/jpeg", prompt: "nocredit move", parameters: [:], webhook: nil,
                                                                             call: call("fal", "fal-ai/veo3.1/image-to-video"))
            Issue.record("fal's locked account was not a failure")
        } catch let error as EffectError {
            #expect(!error.retryable && error.description.contains("refused for billing (403"), "\(error)")
        }
        #expect(try await stats()["billingRefusals"] as? Int == 2, "each billing refusal was asked once")

        // A fal generation that finished as it was given up (fal's cancel answers 400
        // ALREADY_COMPLETED) is paid for: its output is kept, not thrown away.
        let fal = FalAdapter(queueURL: base, key: "fal-right")
        let request = try await fal.submit(image, contentType: "image/jpeg", prompt: "nowebhook done", parameters: [:], webhook: nil,
                                           call: call("fal", "fal-ai/veo3.1/image-to-video"))
        try await waitUntil {
            let answer = try await HTTPClient.shared.execute(fal.authorized(request.statusURL, method: .GET), timeout: .seconds(5))
            return String(buffer: try await answer.body.collect(upTo: 1 << 16)).contains("COMPLETED")
        }
        let kept = await fal.abandon(request, model: "fal-ai/veo3.1/image-to-video")
        #expect(kept?.contentType == "video/mp4" && kept.map { String(decoding: $0.bytes[4..<8], as: UTF8.self) } == "ftyp")
        #expect(try await stats()["cancels"] as? Int == 0)

        // Gemini's RetryInfo: three 429s, each waited out as asked (the fixture records a request
        // sent before the wait it gave as rejected), then the edit.
        let prompt = "ratelimit \(UUID().uuidString)"
        let output = try await GeminiAdapter(baseURL: base, key: "gemini-right").edit(image, contentType: "image/jpeg", prompt: prompt, call: call("gemini", "gemini-2.5-flash-image"))
        #expect(output.bytes == image)
        let seen = try await stats()
        #expect((seen["rateLimited"] as? [String: Int])?[prompt] == 3)
        #expect(seen["rejected"] as? [String] == ["gemini: wrong x-goog-api-key"])

        // A wait asked for past the model's timeout fails the attempt at once, saying so.
        do {
            _ = try await GeminiAdapter(baseURL: base, key: "gemini-right").edit(image, contentType: "image/jpeg", prompt: "ratelimit \(UUID().uuidString)",
                                                                               call: ProviderCall(provider: "gemini", model: "gemini-2.5-flash-image", timeout: .seconds(1)))
            Issue.record("a wait past the timeout was not a failure")
        } catch let error as EffectError {
            #expect(error.retryable && error.description.contains("gemini asked to wait 2.5 s before trying again, past the model's timeout of 1 s"), "\(error)")
        }
        await fixture.stop()
    }
}
