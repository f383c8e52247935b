import Blobs
import Foundation
import NIOHTTP1

/// One promise of the system, checked after a run.
struct InvariantResult: Codable, Sendable {
    var name: String
    var held: Bool
    /// How many things were checked (jobs, users, failures).
    var checked: Int
    /// How many broke the promise.
    var broken: Int
    /// The first few that broke it.
    var details: [String]
}

/// Checks, once the load has stopped, that the system kept its promises to the virtual users:
/// every accepted job ended, every completed job's result and 200×200 thumbnail download, no user
/// was admitted past a limit, each charge was settled as its job ended (none left reserved),
/// history lists each job once and none deleted, and no 5xx other than 503 (nor an unanswered
/// request) happened outside the times a process was down. Eventually consistent promises are
/// polled for up to `settle`.
struct InvariantChecker {
    let client: GatewayClient
    let ledger: Ledger
    let recorder: Recorder
    let chaosWindows: [ClosedRange<Double>]
    let settle: Duration
    static let maxDetails = 10

    struct Usage: Decodable {
        struct Window: Decodable { var limit: Int? }
        struct Status: Decodable { var daily: Window; var monthly: Window }
        struct Charge: Decodable { var jobId: String; var cost: Int; var state: String; var dayKey: String; var monthKey: String }
        var status: Status
        var charges: [Charge]
    }

    func check() async -> [InvariantResult] {
        let deadline = ContinuousClock.now + settle
        await waitUntilReady(deadline: deadline)
        var results: [InvariantResult] = []
        results.append(await jobsEnded(deadline: deadline))
        results.append(await resultsDownload())
        let usages = await settledUsages(deadline: deadline)
        results.append(limitsHeld(usages))
        results.append(await chargesMatch(usages))
        results.append(await historyMatches(usages, deadline: deadline))
        results.append(noUnexpectedFailures())
        return results
    }

    private func waitUntilReady(deadline: ContinuousClock.Instant) async {
        while ContinuousClock.now < deadline {
            if await client.send("GET /readyz", .GET, "/readyz", record: false)?.status == 200 { return }
            try? await Task.sleep(for: .milliseconds(500))
        }
    }

    /// Runs `body` over `items` with at most `limit` at once.
    static func concurrently<Item: Sendable, Result: Sendable>(_ items: [Item], limit: Int = 16, _ body: @escaping @Sendable (Item) async -> Result) async -> [Result] {
        await withTaskGroup(of: (Int, Result).self) { group in
            var results: [(Int, Result)] = []
            var iterator = items.enumerated().makeIterator()
            for _ in 0..<limit {
                guard let (index, item) = iterator.next() else { break }
                group.addTask { (index, await body(item)) }
            }
            while let result = await group.next() {
                results.append(result)
                if let (index, item) = iterator.next() { group.addTask { (index, await body(item)) } }
            }
            return results.sorted { $0.0 < $1.0 }.map(\.1)
        }
    }

    private struct Job: Sendable {
        var id: String
        var user: Credentials
    }

    /// Every accepted job that was not deleted reached completed, failed or cancelled.
    private func jobsEnded(deadline: ContinuousClock.Instant) async -> InvariantResult {
        var pending: [Job] = []
        var total = 0
        for user in ledger.all {
            for (job, _) in user.accepted where !user.gone(job) {
                total += 1
                if !Session.terminal.contains(user.states[job] ?? "") { pending.append(Job(id: job, user: user.credentials)) }
            }
        }
        var missing: [String] = []
        let client = self.client, ledger = self.ledger
        while !pending.isEmpty && ContinuousClock.now < deadline {
            let states = await Self.concurrently(pending) { job in
                let answer = await client.send("GET /api/v1/jobs/{id}/status", .GET, "/api/v1/jobs/\(job.id)/status", as: job.user, record: false)
                return (answer?.status, answer?.object?["status"] as? String)
            }
            var still: [Job] = []
            for (job, (status, state)) in zip(pending, states) {
                if status == 404 {
                    missing.append("\(job.id) (\(job.user.userId)): accepted, now 404")
                } else if let state, Session.terminal.contains(state) {
                    ledger.saw(state, job: job.id, user: job.user.userId)
                } else {
                    still.append(job)
                }
            }
            pending = still
            if !pending.isEmpty { try? await Task.sleep(for: .seconds(1)) }
        }
        let broken = missing + pending.map { "\($0.id) (\($0.user.userId)): not finished within the settle time" }
        return InvariantResult(name: "every accepted job reached a terminal state", held: broken.isEmpty, checked: total,
                               broken: broken.count, details: Array(broken.prefix(Self.maxDetails)))
    }

    /// Every completed job's result downloads, and its thumbnail is a 200×200 image.
    private func resultsDownload() async -> InvariantResult {
        var jobs: [Job] = []
        for user in ledger.all {
            for (job, state) in user.states where state == "completed" && !user.gone(job) {
                jobs.append(Job(id: job, user: user.credentials))
            }
        }
        let client = self.client
        let problems = await Self.concurrently(jobs) { job -> String? in
            guard let answer = await client.send("GET /api/v1/jobs/{id}", .GET, "/api/v1/jobs/\(job.id)", as: job.user, record: false),
                  answer.status == 200, let object = answer.object else { return "\(job.id): job not readable" }
            guard let result = object["resultUrl"] as? String, let thumbnail = object["thumbnailUrl"] as? String else {
                return "\(job.id): completed without result or thumbnail URL"
            }
            guard let file = await client.send("GET /files/result", .GET, result, record: false), file.status == 200, !file.body.isEmpty else {
                return "\(job.id): result did not download"
            }
            guard let thumb = await client.send("GET /files/thumbnail", .GET, thumbnail, record: false), thumb.status == 200 else {
                return "\(job.id): thumbnail did not download"
            }
            let type = thumb.headers.first(name: "Content-Type") ?? "image/jpeg"
            guard let size = ImageSize.read(thumb.body, contentType: type), size.width == 200, size.height == 200 else {
                return "\(job.id): thumbnail is \(ImageSize.read(thumb.body, contentType: type).map { "\($0)" } ?? "unreadable"), not 200×200"
            }
            return nil
        }.compactMap { $0 }
        return InvariantResult(name: "every completed job's result and 200×200 thumbnail download", held: problems.isEmpty,
                               checked: jobs.count, broken: problems.count, details: Array(problems.prefix(Self.maxDetails)))
    }

    /// Each user's usage once no charge is reserved any more (or the settle time is up).
    private func settledUsages(deadline: ContinuousClock.Instant) async -> [String: Usage] {
        var usages: [String: Usage] = [:]
        var pending = ledger.all.map(\.credentials)
        let client = self.client
        while !pending.isEmpty {
            let answers = await Self.concurrently(pending) { user -> Usage? in
                let id = user.userId.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? user.userId
                guard let answer = await client.send("GET /admin/v1/users/{id}/usage", .GET, "/admin/v1/users/\(id)/usage", admin: true, record: false),
                      answer.status == 200 else { return nil }
                return try? JSONDecoder().decode(Usage.self, from: Data(answer.body))
            }
            var still: [Credentials] = []
            for (user, usage) in zip(pending, answers) {
                if let usage { usages[user.userId] = usage }
                if usage == nil || usage!.charges.contains(where: { $0.state == "reserved" }) { still.append(user) }
            }
            pending = still
            guard ContinuousClock.now < deadline else { break }
            if !pending.isEmpty { try? await Task.sleep(for: .seconds(1)) }
        }
        return usages
    }

    /// No user holds more unreleased units in a day or a month than the plan's limit.
    private func limitsHeld(_ usages: [String: Usage]) -> InvariantResult {
        var broken: [String] = []
        for (user, usage) in usages.sorted(by: { $0.key < $1.key }) {
            let held = usage.charges.filter { $0.state != "released" }
            for (window, limit, key) in [("daily", usage.status.daily.limit, \Usage.Charge.dayKey), ("monthly", usage.status.monthly.limit, \Usage.Charge.monthKey)] {
                guard let limit else { continue }
                for (period, charges) in Dictionary(grouping: held, by: { $0[keyPath: key] }) {
                    let used = charges.reduce(0) { $0 + $1.cost }
                    if used > limit { broken.append("\(user): \(used) units in \(window) window \(period), limit \(limit)") }
                }
            }
        }
        let missing = ledger.all.filter { usages[$0.credentials.userId] == nil }.map { "\($0.credentials.userId): usage not readable" }
        broken += missing
        return InvariantResult(name: "no user was admitted past a daily or monthly limit", held: broken.isEmpty, checked: usages.count,
                               broken: broken.count, details: Array(broken.prefix(Self.maxDetails)))
    }

    /// Committed charges are the completed jobs, released ones the failed and cancelled (and
    /// those whose job was never created), none is left reserved, and every accepted job has one.
    private func chargesMatch(_ usages: [String: Usage]) async -> InvariantResult {
        var broken: [String] = []
        var checked = 0
        var committed = 0, released = 0, reserved = 0
        for user in ledger.all {
            guard let usage = usages[user.credentials.userId] else { continue }
            let charged = Dictionary(usage.charges.map { ($0.jobId, $0) }, uniquingKeysWith: { first, _ in first })
            for (job, _) in user.accepted where charged[job] == nil {
                broken.append("\(job) (\(user.credentials.userId)): accepted without a charge")
            }
            for charge in usage.charges {
                checked += 1
                switch charge.state {
                case "committed": committed += 1
                case "released": released += 1
                default: reserved += 1
                }
                var state = user.states[charge.jobId]
                if state == nil || !Session.terminal.contains(state!) {
                    // A job this run never heard of (a creation whose answer was lost): ask.
                    let answer = await client.send("GET /api/v1/jobs/{id}/status", .GET, "/api/v1/jobs/\(charge.jobId)/status", as: user.credentials, record: false)
                    state = answer?.status == 404 ? "absent" : answer?.object?["status"] as? String
                }
                let expected: String? = switch state {
                case "completed": "committed"
                case "failed", "cancelled", "absent": "released"
                default: nil
                }
                if charge.state != expected {
                    broken.append("\(charge.jobId) (\(user.credentials.userId)): charge \(charge.state), job \(state ?? "unknown")")
                }
            }
        }
        return InvariantResult(name: "charges settled as their jobs ended: committed = completed, released = failed + cancelled, none reserved (\(committed) committed, \(released) released, \(reserved) reserved)",
                               held: broken.isEmpty, checked: checked, broken: broken.count, details: Array(broken.prefix(Self.maxDetails)))
    }

    /// Each user's history lists each of their jobs once and none they deleted.
    private func historyMatches(_ usages: [String: Usage], deadline: ContinuousClock.Instant) async -> InvariantResult {
        var pending = ledger.all
        var problems: [String: [String]] = [:]
        let client = self.client
        repeat {
            let listings = await Self.concurrently(pending) { user in await Self.history(of: user.credentials, client: client) }
            var still: [Ledger.User] = []
            for (user, listing) in zip(pending, listings) {
                let known = Set(usages[user.credentials.userId]?.charges.map(\.jobId) ?? [])
                let found = Self.compare(user, listing: listing, known: known)
                if found.isEmpty { problems[user.credentials.userId] = nil } else {
                    problems[user.credentials.userId] = found
                    still.append(user)
                }
            }
            pending = still
            if !pending.isEmpty && ContinuousClock.now < deadline { try? await Task.sleep(for: .seconds(1)) }
        } while !pending.isEmpty && ContinuousClock.now < deadline
        let broken = problems.sorted { $0.key < $1.key }.flatMap(\.value)
        return InvariantResult(name: "history lists each job exactly once and none deleted", held: broken.isEmpty, checked: ledger.all.count,
                               broken: broken.count, details: Array(broken.prefix(Self.maxDetails)))
    }

    /// Every id in a user's history, following the cursor; nil if a page did not come.
    static func history(of user: Credentials, client: GatewayClient) async -> [String]? {
        var ids: [String] = []
        var cursor: String?
        for _ in 0..<100 {
            let query = cursor.map { "&cursor=\($0.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed) ?? $0)" } ?? ""
            guard let answer = await client.send("GET /api/v1/history", .GET, "/api/v1/history?limit=100\(query)", as: user, record: false),
                  answer.status == 200, let object = answer.object, let items = object["items"] as? [[String: Any]] else { return nil }
            ids += items.compactMap { $0["id"] as? String }
            cursor = object["nextCursor"] as? String
            if object["hasMore"] as? Bool != true || cursor == nil { return ids }
        }
        return ids
    }

    static func compare(_ user: Ledger.User, listing: [String]?, known: Set<String>) -> [String] {
        let who = user.credentials.userId
        guard let listing else { return ["\(who): history not readable"] }
        var problems: [String] = []
        let counts = Dictionary(listing.map { ($0, 1) }, uniquingKeysWith: +)
        for (job, _) in user.accepted where !user.deleted.contains(job) {
            let count = counts[job] ?? 0
            // A delete that got no answer may have happened: listed once or not at all.
            if count != 1 && !(count == 0 && user.mayBeDeleted.contains(job)) { problems.append("\(job) (\(who)): listed \(count) times") }
        }
        for job in user.deleted where counts[job] != nil { problems.append("\(job) (\(who)): deleted, still listed") }
        for job in counts.keys where user.accepted[job] == nil && !known.contains(job) {
            problems.append("\(job) (\(who)): listed, never created for this user")
        }
        return problems
    }

    /// Every 5xx was a 503, and it and every unanswered request came while a process was down.
    private func noUnexpectedFailures() -> InvariantResult {
        let failures = recorder.failures
        let broken = failures.filter { failure in
            !((failure.status == 503 || failure.status == 0) && chaosWindows.contains { $0.contains(failure.at) })
        }
        let details = broken.prefix(Self.maxDetails).map {
            String(format: "%.1f s %@ → %@: %@", $0.at, $0.route, $0.status == 0 ? "no answer" : "\($0.status)", $0.detail)
        }
        return InvariantResult(name: "no 5xx other than 503, and no unanswered request, except while a process was down",
                               held: broken.isEmpty, checked: failures.count, broken: broken.count, details: details)
    }
}
