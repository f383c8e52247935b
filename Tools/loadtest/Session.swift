import Foundation
import NIOHTTP1

/// One virtual user's visit to the app: check the quota, upload a photo, start edits, follow
/// them (polling every 2 s as the app does, or over the event stream), fetch the results, browse
/// and search the history, delete one, re-run one, with think times between the steps.
///
/// Every request has a planned start: the session's arrival for the first, the end of the
/// previous step plus the think time for the next, the poll schedule for polls. Latency is
/// counted from that plan, so a server that stalls cannot hide its queue (no coordinated
/// omission).
struct Session {
    let client: GatewayClient
    let ledger: Ledger
    let mix: Mix
    let images: [String: [UInt8]]
    /// No request is planned after this instant (the end of the run's drain).
    let stopAt: ContinuousClock.Instant
    var rng: SeededGenerator
    private var next: ContinuousClock.Instant = .now

    init(client: GatewayClient, ledger: Ledger, mix: Mix, images: [String: [UInt8]], stopAt: ContinuousClock.Instant, seed: UInt64) {
        self.client = client
        self.ledger = ledger
        self.mix = mix
        self.images = images
        self.stopAt = stopAt
        self.rng = SeededGenerator(seed: seed)
    }

    static let terminal: Set<String> = ["completed", "failed", "cancelled"]
    private var recorder: Recorder { client.recorder }

    private mutating func think() {
        let seconds = Double.random(in: mix.thinkTime[0]...mix.thinkTime[1], using: &rng)
        next = .now + .milliseconds(Int(seconds * 1000))
    }

    private var stopped: Bool { ContinuousClock.now >= stopAt || Task.isCancelled || recorder.full }

    /// Runs one session for a new user of a profile drawn from the mix, arriving at `arrival`.
    mutating func run(index: Int, runId: String, arrival: ContinuousClock.Instant) async {
        next = arrival
        let profile = mix.profiles[rng.weighted(Dictionary(uniqueKeysWithValues: mix.profiles.enumerated().map { ($0.offset, $0.element.weight) }))]
        let user: Credentials
        if profile.signedIn {
            guard let signed = try? await client.user("lt-\(runId)-\(index)") else { return }
            user = signed
        } else {
            user = GatewayClient.guest()
        }
        guard ledger.register(user, profile: profile.name, plan: profile.signedIn ? profile.plan : "free") else { return }
        if profile.signedIn && profile.plan != "free" {
            let answer = await client.send("PUT /admin/v1/users/{id}/plan", .PUT, "/admin/v1/users/\(user.userId)/plan", admin: true,
                                           json: ["plan": profile.plan], planned: next)
            guard answer?.status == 200 else { return }
        }
        _ = await client.send("GET /api/v1/users/me", .GET, "/api/v1/users/me", as: user, planned: next)
        think()
        guard !stopped, let imageKey = await upload(as: user) else { return }
        think()

        var jobs: [String] = []
        let count = Int.random(in: profile.jobs[0]...profile.jobs[1], using: &rng)
        for _ in 0..<count where !stopped {
            guard let created = await createJob(imageKey: imageKey, as: user) else { break }
            jobs.append(created)
            next = .now + .milliseconds(Int.random(in: 100...400, using: &rng))
        }
        var finished: [String] = []
        for job in jobs where !stopped {
            if let state = await follow(job, as: user) {
                finished.append(job)
                if state == "completed" { await fetchResult(job, as: user) }
            }
            think()
        }
        guard !stopped else { return }
        if rng.chance(mix.flows.history) {
            _ = await client.send("GET /api/v1/history", .GET, "/api/v1/history?limit=20", as: user, planned: next)
            think()
        }
        if rng.chance(mix.flows.search), !stopped {
            let word = ["Black", "Original", "Enhance", "Soft"].randomElement(using: &rng)!
            _ = await client.send("GET /api/v1/history?q=", .GET, "/api/v1/history?limit=20&q=\(word)", as: user, planned: next)
            think()
        }
        if rng.chance(mix.flows.rerun), !stopped, let source = finished.randomElement(using: &rng) {
            let client = self.client
            let answer = await retrying { planned in
                await client.send("POST /api/v1/history/{id}/rerun", .POST, "/api/v1/history/\(source)/rerun", as: user, planned: planned)
            }
            if answer?.status == 202, let job = answer?.object?["jobId"] as? String {
                if ledger.accepted(job, user: user.userId) { recorder.jobAccepted() }
                think()
                if let state = await follow(job, as: user) {
                    finished.append(job)
                    if state == "completed" { await fetchResult(job, as: user) }
                }
            }
            think()
        }
        if rng.chance(mix.flows.delete), !stopped, let victim = finished.randomElement(using: &rng) {
            // A delete sent again by its user answers as the first did, so a delete whose answer
            // was lost (its gateway killed after history committed it) is retried as the app does.
            // One that never gets an answer may or may not have happened: the invariants accept
            // either for it.
            let client = self.client
            let answer = await retrying { planned in
                await client.send("DELETE /api/v1/history/{id}", .DELETE, "/api/v1/history/\(victim)", as: user, planned: planned)
            }
            if let status = answer?.status, (200..<300).contains(status) {
                ledger.deleted(victim, user: user.userId)
            } else if answer == nil || [502, 503, 504].contains(answer!.status) {
                ledger.mayHaveDeleted(victim, user: user.userId)
            }
        }
    }

    /// Sends a request planned at `next`, again (same request, planned 1 s after the answer, or
    /// after `Retry-After` up to 5 s) while no answer comes or it is a 502, 503 or 504: at most
    /// four tries.
    private mutating func retrying(_ send: (ContinuousClock.Instant) async -> Answer?) async -> Answer? {
        let answer = await Self.retrying(from: next, stopAt: stopAt, send)
        next = .now
        return answer
    }

    private static func retrying(from first: ContinuousClock.Instant, stopAt: ContinuousClock.Instant, _ send: (ContinuousClock.Instant) async -> Answer?) async -> Answer? {
        var planned = first
        var answer: Answer?
        for _ in 0..<4 {
            answer = await send(planned)
            guard answer == nil || [502, 503, 504].contains(answer!.status), ContinuousClock.now < stopAt, !Task.isCancelled else { break }
            let wait = answer?.headers.first(name: "Retry-After").flatMap(Double.init).map { min(5, max(0.2, $0)) } ?? 1
            planned = .now + .milliseconds(Int(wait * 1000))
        }
        return answer
    }

    /// Presigns and uploads one of the fixture images; the image key, nil if refused.
    private mutating func upload(as user: Credentials) async -> String? {
        let name = mix.images.randomElement(using: &rng)!
        let client = self.client
        let presign = await retrying { planned in
            await client.send("POST /api/v1/uploads/presigned", .POST, "/api/v1/uploads/presigned", as: user,
                              json: ["filename": "\(name).png", "contentType": "image/png"], planned: planned)
        }
        guard presign?.status == 200, let object = presign?.object, let url = object["uploadUrl"] as? String,
              let key = object["imageKey"] as? String else { return nil }
        let headers = (object["headers"] as? [String: String] ?? ["Content-Type": "image/png"]).map { ($0.key, $0.value) }
        let bytes = images[name]!
        think()
        var tries = 0
        let put = await retrying { planned in
            tries += 1
            return await client.send("PUT /api/v1/uploads/{key}", .PUT, url, headers: headers, body: bytes, planned: planned)
        }
        // 201 from the gateway's own upload route (folder store), 200 from an object store. A
        // retried PUT may find its first try's image stored: 409 (gateway) or 412 (object store,
        // `If-None-Match: *`) then means it is there.
        guard put?.status == 201 || put?.status == 200 || ((put?.status == 409 || put?.status == 412) && tries > 1) else { return nil }
        return key
    }

    /// Creates a job with an `Idempotency-Key`, reused for every retry: its id, or nil when
    /// refused (429 ends the session's edits).
    private mutating func createJob(imageKey: String, as user: Credentials) async -> String? {
        let key = UUID().uuidString
        let effect = rng.weighted(mix.effects)
        let client = self.client
        let answer = await retrying { planned in
            await client.send("POST /api/v1/jobs", .POST, "/api/v1/jobs", as: user, headers: [("Idempotency-Key", key)],
                              json: ["imageKey": imageKey, "effectId": effect, "parameters": [String: Double]()], planned: planned)
        }
        guard let answer else { return nil }
        guard answer.status == 202, let job = answer.object?["jobId"] as? String else { return nil }
        if ledger.accepted(job, user: user.userId) { recorder.jobAccepted() }
        return job
    }

    /// Follows a job until it ends (or the session's follow timeout): over the event stream for a
    /// share of sessions (falling back to polling if the stream breaks), else by polling its status
    /// every `pollInterval`. The final state, nil if not seen.
    private mutating func follow(_ job: String, as user: Credentials) async -> String? {
        let deadline = min(stopAt, .now + .milliseconds(Int(mix.followTimeout * 1000)))
        if rng.chance(mix.flows.sse), next.duration(to: deadline) > .seconds(5) {
            let state = await client.follow(events: job, as: user, planned: next, limit: next.duration(to: deadline))
            if state == "gone" { return nil }
            if let state, Self.terminal.contains(state) { return finished(job, state, user) }
        }
        var planned = max(next, .now)
        let interval = Duration.milliseconds(Int(mix.pollInterval * 1000))
        while planned < deadline && !stopped {
            let answer = await client.send("GET /api/v1/jobs/{id}/status", .GET, "/api/v1/jobs/\(job)/status", as: user, planned: planned)
            if answer?.status == 404 { return nil }
            if answer?.status == 200, let state = answer?.object?["status"] as? String {
                ledger.saw(state, job: job, user: user.userId)
                if Self.terminal.contains(state) { return finished(job, state, user) }
            }
            planned += interval
        }
        return nil
    }

    private func finished(_ job: String, _ state: String, _ user: Credentials) -> String {
        ledger.saw(state, job: job, user: user.userId)
        recorder.jobFinished()
        return state
    }

    /// Reads the job and downloads its result and thumbnail, as the app shows them.
    private mutating func fetchResult(_ job: String, as user: Credentials) async {
        think()
        let answer = await client.send("GET /api/v1/jobs/{id}", .GET, "/api/v1/jobs/\(job)", as: user, planned: next)
        guard answer?.status == 200, let object = answer?.object else { return }
        next = .now
        if let thumbnail = object["thumbnailUrl"] as? String {
            _ = await client.send("GET /files/thumbnail", .GET, thumbnail, planned: next)
            next = .now
        }
        if let result = object["resultUrl"] as? String {
            _ = await client.send("GET /files/result", .GET, result, planned: next)
        }
    }
}
