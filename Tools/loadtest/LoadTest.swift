import ArgumentParser
import Foundation
import Messages
import Histogram
import Synchronization

/// `loadtest`: drives the app's flows through the gateway, then checks the system's promises.
@main
struct LoadTest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "loadtest",
        abstract: "Drives the app's real flows through the gateway, measures them, and checks the system's invariants after the run.",
        discussion: """
            Virtual users (signed in and guests, on chosen plans) check their quota, upload photos, start edits, \
            follow them by polling or over the event stream, fetch results, browse, search, delete and re-run. \
            With --chaos, one process of the local stack is killed (SIGKILL) every few seconds and `make run` restarts it. \
            The exit status is 0 only if every invariant held and no threshold was crossed.
            """
    )

    enum Model: String, ExpressibleByArgument, Sendable { case open, closed }

    @Option(help: "The gateway's base URL (default $LOADTEST_TARGET, else http://127.0.0.1:$GATEWAY_PORT).")
    var target: String?
    @Option(help: "HS256 secret of user tokens (default $JWT_SECRET).")
    var jwtSecret: String?
    @Option(help: "Bearer token of the admin routes (default $ADMIN_TOKEN).")
    var adminToken: String?
    @Option(name: .customLong("duration"), help: "How long the load lasts: 30s, 2m, 1h30m, 500ms (a bare number is seconds).")
    var durationGiven = DurationArgument(seconds: 60)
    @Option(help: "open: sessions arrive at --rate a second whatever the server does; closed: --users users each run sessions back to back.")
    var model: Model = .open
    @Option(help: "Open model: new sessions a second at the start.")
    var rate: Double = 4
    @Option(help: "Open model: sessions a second at the end (a linear ramp from --rate); default: constant.")
    var rampTo: Double?
    @Option(help: "Closed model: concurrent users.")
    var users: Int = 20
    @Option(help: "The most sessions in progress at once; an arrival past it is dropped and counted.")
    var maxSessions: Int = 2000
    @Option(help: "Requests at most: past it no session sends another.")
    var maxRequests: Int = 1_000_000
    @Option(name: .customLong("drain"), help: "How long the sessions in progress may go on after --duration before they are stopped (20s, 1m).")
    var drainGiven = DurationArgument(seconds: 20)
    @Option(name: .customLong("settle"), help: "How long the invariants may wait for the system to settle: jobs to end, charges to settle, history to catch up (3m).")
    var settleGiven = DurationArgument(seconds: 180)
    @Option(help: "A JSON file with the mix: profiles, effects, flows, thinkTime, pollInterval, followTimeout, images (docs/loadtest.md).")
    var config: String?
    @Option(name: .customLong("threshold"), help: "A pass/fail criterion such as 'POST /api/v1/jobs p99<50ms' or 'errors<0.1%' (repeatable).")
    var thresholds: [String] = []
    @Option(help: "Writes every figure of the run to this JSON file.")
    var json: String?
    @Option(help: "Writes a self-contained HTML report to this file.")
    var report: String?
    @Flag(help: "Kills one process of the local stack (SIGKILL) every --chaos-interval seconds.")
    var chaos = false
    @Option(name: .customLong("chaos-interval"), help: "Time between two kills (8s).")
    var chaosIntervalGiven = DurationArgument(seconds: 8)
    @Option(help: "Only these processes are killed (comma-separated: gateway, quota, history, jobs, worker, postgres, radosgw; a kind takes its replicas and workers, or name one: quota-2, worker-1); default all.")
    var chaosOnly: String?
    @Option(help: "The first processes killed, in order (comma-separated, e.g. radosgw, or jobs-1,jobs-2 so that a short run surely kills the leading jobs replica); then at random.")
    var chaosFirst: String?
    @Option(help: "A fault to apply during the load: a shell command run at --fault-at (e.g. `scripts/hosts.sh partition DIR svc1`); --heal-command undoes it --fault-for later. The run reports the share of requests answered before, during and after it, and how long after the heal the earlier rate came back.")
    var faultCommand: String?
    @Option(help: "The command that heals the fault (run even if the load ends first).")
    var healCommand: String?
    @Option(help: "The fault's name in the report (default: its command).")
    var faultName: String?
    @Option(name: .customLong("fault-at"), help: "When the fault starts, from the start of the run (10s).")
    var faultAtGiven = DurationArgument(seconds: 10)
    @Option(name: .customLong("fault-for"), help: "How long the fault lasts (15s).")
    var faultForGiven = DurationArgument(seconds: 15)
    @Option(name: .customLong("fault-recovery"), help: "How long after the heal 503s and unanswered requests are still expected (15s).")
    var faultRecoveryGiven = DurationArgument(seconds: 15)
    @Option(help: "The folder of the stack's pid files (default $DATA_DIR/pids, else .data/pids).")
    var pids: String?
    @Option(help: "Random seed (default: from the clock); the same seed picks the same mix and victims.")
    var seed: UInt64?
    @Option(help: "HTTP connections to the gateway for the checks after the run (each session has its own few).")
    var connections: Int = 32

    /// The lengths of time given, in seconds.
    var duration: Double { durationGiven.seconds }
    var drain: Double { drainGiven.seconds }
    var settle: Double { settleGiven.seconds }
    var chaosInterval: Double { chaosIntervalGiven.seconds }
    var faultAt: Double { faultAtGiven.seconds }
    var faultFor: Double { faultForGiven.seconds }

    func validate() throws {
        guard duration > 0, duration <= 24 * 3600 else { throw ValidationError("--duration: 1 s to 24 h") }
        guard rate > 0, rate <= 10_000, (rampTo ?? 1) > 0, (rampTo ?? 1) <= 10_000 else { throw ValidationError("--rate and --ramp-to: more than 0, at most 10000") }
        guard (1...100_000).contains(users), (1...100_000).contains(maxSessions) else { throw ValidationError("--users and --max-sessions: 1 to 100000") }
        guard (1...100_000_000).contains(maxRequests) else { throw ValidationError("--max-requests: 1 to 100000000") }
        guard chaosInterval >= 1, drain >= 0, settle >= 0, (1...10_000).contains(connections) else {
            throw ValidationError("--chaos-interval at least 1 s; --drain and --settle not negative; --connections 1 to 10000")
        }
        for threshold in thresholds { _ = try Threshold(threshold) }
        guard (faultCommand == nil) == (healCommand == nil) else { throw ValidationError("--fault-command and --heal-command go together") }
        if faultCommand != nil {
            guard faultAt > 0, faultFor > 0, faultAt + faultFor < duration, faultRecoveryGiven.seconds >= 0 else {
                throw ValidationError("--fault-at and --fault-for: more than 0, the fault healed before --duration ends")
            }
        }
    }

    func run() async throws {
        let environment = ProcessInfo.processInfo.environment
        let target = target ?? environment["LOADTEST_TARGET"] ?? "http://127.0.0.1:\(environment["GATEWAY_PORT"] ?? "\(SharedDefaults.gatewayPort)")"
        guard let jwtSecret = jwtSecret ?? environment["JWT_SECRET"], let adminToken = adminToken ?? environment["ADMIN_TOKEN"] else {
            throw ValidationError("loadtest signs users' tokens and reads usage: give --jwt-secret and --admin-token (or JWT_SECRET and ADMIN_TOKEN), the gateway's")
        }
        let mix = try config.map(Mix.load) ?? Mix()
        let thresholds = try self.thresholds.map(Threshold.init)
        let seed = seed ?? UInt64(Date().timeIntervalSince1970 * 1000)
        let runId = String(seed, radix: 36)
        let images = FixtureImages.make()
        let start = ContinuousClock.now
        let startedAt = ISO8601DateFormatter().string(from: Date())
        let recorder = Recorder(start: start, maxRequests: maxRequests)
        let ledger = Ledger()
        let client = await GatewayClient(base: target, jwtSecret: jwtSecret, adminToken: adminToken, recorder: recorder, connections: connections)
        defer { Task { await client.shutdown() } }

        guard await client.send("GET /readyz", .GET, "/readyz", record: false)?.status == 200 else {
            await client.shutdown()
            throw ValidationError("\(target)/readyz does not answer 200: is the stack running (make run)?")
        }
        let chaosRunner: Chaos? = chaos ? Chaos(
            directory: URL(fileURLWithPath: pids ?? "\(environment["DATA_DIR"] ?? SharedDefaults.dataDirectory)/pids"),
            interval: .milliseconds(Int(chaosInterval * 1000)), recorder: recorder,
            only: Set((chaosOnly ?? "").split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }),
            first: (chaosFirst ?? "").split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }
        ) : nil
        if let chaosRunner, chaosRunner.processes().isEmpty {
            await client.shutdown()
            throw ValidationError("--chaos: no live process in \(chaosRunner.directory.path) (make run writes one pid file per process there)")
        }

        let fault = faultCommand.map { command in
            Fault(name: faultName ?? command, command: command, healCommand: healCommand ?? "", at: faultAt, length: faultFor,
                  recovery: faultRecoveryGiven.seconds, recorder: recorder)
        }
        let loadEnd = start + .milliseconds(Int(duration * 1000))
        let stopAt = loadEnd + .milliseconds(Int(drain * 1000))
        let terminal = isatty(STDOUT_FILENO) == 1
        print("loadtest: \(model.rawValue) model, \(model == .open ? "\(rate)\(rampTo.map { "→\($0)" } ?? "") sessions/s" : "\(users) users") for \(Int(duration)) s against \(target)\(chaos ? ", chaos every \(chaosInterval) s" : ""), seed \(seed)")

        let sessions = Counter()
        let live = Task { await liveLine(recorder: recorder, chaos: chaosRunner, terminal: terminal, until: stopAt, loadEnd: loadEnd) }
        let chaosTask = Task { await chaosRunner?.run(until: loadEnd, seed: seed ^ 0xC4A05) }
        let faultTask = Task { await fault?.run() }
        let load = Task {
            switch model {
            case .open:
                await openModel(client: client, ledger: ledger, mix: mix, images: images, seed: seed, runId: runId,
                                start: start, loadEnd: loadEnd, stopAt: stopAt, sessions: sessions)
            case .closed:
                await closedModel(client: client, ledger: ledger, mix: mix, images: images, seed: seed, runId: runId,
                                  loadEnd: loadEnd, stopAt: stopAt, sessions: sessions)
            }
        }
        // Sessions still going at the end of the drain are cancelled.
        let stopper = Task {
            try? await Task.sleep(until: stopAt + .seconds(5), clock: .continuous)
            load.cancel()
        }
        await load.value
        stopper.cancel()
        await chaosTask.value
        await faultTask.value
        let seconds = min(recorder.elapsed(), duration + drain)
        live.cancel()
        await live.value
        if terminal { print("") }
        print("load done; checking invariants (up to \(Int(settle)) s for the system to settle)...")
        fflush(nil)

        let windows = (chaosRunner?.downWindows(runEnd: recorder.elapsed()) ?? []) + [fault?.window(runEnd: recorder.elapsed())].compactMap { $0 }
        let invariants = await InvariantChecker(client: client, ledger: ledger, recorder: recorder, chaosWindows: windows,
                                                settle: .milliseconds(Int(settle * 1000))).check()
        await client.shutdown()

        let summary = makeSummary(recorder: recorder, target: target, startedAt: startedAt, seconds: seconds, seed: seed,
                                  sessions: sessions.value, chaos: (chaosRunner?.events ?? []) + (fault?.events ?? []), invariants: invariants,
                                  thresholds: thresholds, fault: fault)
        print(Report.text(summary))
        if let json {
            try Report.json(summary).write(to: URL(fileURLWithPath: json))
            print("figures written to \(json)")
        }
        if let report {
            try Data(Report.html(summary).utf8).write(to: URL(fileURLWithPath: report))
            print("report written to \(report)")
        }
        if !summary.passed { throw ExitCode(1) }
    }

    /// Sessions arriving at a planned rate (constant, or ramping linearly to `rampTo`), each
    /// planned at its arrival time whatever happened before.
    func openModel(client: GatewayClient, ledger: Ledger, mix: Mix, images: [String: [UInt8]], seed: UInt64, runId: String,
                   start: ContinuousClock.Instant, loadEnd: ContinuousClock.Instant, stopAt: ContinuousClock.Instant, sessions: Counter) async {
        let endRate = rampTo ?? rate
        let active = Counter()
        await withDiscardingTaskGroup { group in
            var index = 0
            var at = 0.0
            while at < duration && !Task.isCancelled && !client.recorder.full {
                let arrival = start + .milliseconds(Int(at * 1000))
                try? await Task.sleep(until: arrival, clock: .continuous)
                if active.value >= maxSessions {
                    client.recorder.sessionDropped()
                } else {
                    active.increment()
                    sessions.increment()
                    let session = Session(client: client.forSession(), ledger: ledger, mix: mix, images: images, stopAt: stopAt, seed: seed &+ UInt64(index) &* 0x9E37_79B9)
                    let number = index
                    group.addTask {
                        var session = session
                        await session.run(index: number, runId: runId, arrival: arrival)
                        await session.client.shutdown()
                        active.decrement()
                    }
                }
                index += 1
                let current = rate + (endRate - rate) * at / duration
                at += 1 / max(current, 0.001)
            }
        }
    }

    /// `users` users, each running sessions one after another until the end of the load.
    func closedModel(client: GatewayClient, ledger: Ledger, mix: Mix, images: [String: [UInt8]], seed: UInt64, runId: String,
                     loadEnd: ContinuousClock.Instant, stopAt: ContinuousClock.Instant, sessions: Counter) async {
        await withDiscardingTaskGroup { group in
            for user in 0..<users {
                group.addTask {
                    var round = 0
                    while ContinuousClock.now < loadEnd && !Task.isCancelled && !client.recorder.full {
                        let index = user * 1_000_000 + round
                        sessions.increment()
                        var session = Session(client: client.forSession(), ledger: ledger, mix: mix, images: images, stopAt: stopAt, seed: seed &+ UInt64(index) &* 0x9E37_79B9)
                        await session.run(index: index, runId: runId, arrival: .now)
                        await session.client.shutdown()
                        round += 1
                    }
                }
            }
        }
    }

    /// A line a second on a terminal (rewritten in place), or a plain line every 5 s otherwise.
    func liveLine(recorder: Recorder, chaos: Chaos?, terminal: Bool, until stopAt: ContinuousClock.Instant, loadEnd: ContinuousClock.Instant) async {
        var second = 0
        while !Task.isCancelled {
            try? await Task.sleep(until: recorder.start + .seconds(second + 1), clock: .continuous)
            let (requests, errors, p99) = recorder.closeSecond(second)
            second += 1
            let totals = recorder.totals
            let kills = chaos?.events.filter { $0.kind == "kill" }.count ?? 0
            let elapsed = Double(second)
            let fraction = min(1, elapsed / duration)
            let width = 24
            let filled = Int(fraction * Double(width))
            let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
            let phase = ContinuousClock.now > loadEnd ? "drain" : "\(Int(elapsed))/\(Int(duration)) s"
            let line = "[\(bar)] \(phase)  \(requests) req/s  p99 \(Report.ms(p99))  errors \(errors) (\(totals.errors) in all)  jobs \(totals.jobsAccepted) accepted, \(totals.jobsFinished) done\(chaos == nil ? "" : "  kills \(kills)")"
            if terminal {
                print("\r\u{1B}[2K" + line, terminator: "")
                fflush(nil)
            } else if second % 5 == 0 {
                // Flushed: scripts keep the output in a file and read it while it runs.
                print(line)
                fflush(nil)
            }
        }
    }

    func makeSummary(recorder: Recorder, target: String, startedAt: String, seconds: Double, seed: UInt64, sessions: Int,
                     chaos: [Chaos.Event], invariants: [InvariantResult], thresholds: [Threshold], fault: Fault?) -> RunSummary {
        let byKey = recorder.histograms
        let byRoute = recorder.routeHistograms
        var requests: [String: Int] = [:], errors: [String: Int] = [:]
        for (key, histogram) in byKey {
            requests[key.route, default: 0] += Int(histogram.totalCount)
            if Recorder.isError(key.status) { errors[key.route, default: 0] += Int(histogram.totalCount) }
        }
        let routes = byRoute.keys.sorted().map { route in
            RunSummary.Route(
                route: route, requestsPerSecond: Double(requests[route] ?? 0) / max(seconds, 1), errors: errors[route] ?? 0,
                latency: RunSummary.latency(byRoute[route]!),
                statuses: Dictionary(uniqueKeysWithValues: byKey.filter { $0.key.route == route }.map { ("\($0.key.status)", RunSummary.latency($0.value)) }),
                distribution: RunSummary.distribution(byRoute[route]!)
            )
        }
        let totals = recorder.totals
        let thresholdResults = thresholds.map { $0.evaluate(histograms: byRoute, requests: requests, errors: errors, seconds: max(seconds, 1)) }
        return RunSummary(
            target: target, model: model.rawValue, startedAt: startedAt, seconds: seconds, seed: seed, sessions: sessions,
            droppedSessions: recorder.droppedSessions, requests: totals.requests, errors: totals.errors,
            requestsPerSecond: Double(totals.requests) / max(seconds, 1), jobsAccepted: totals.jobsAccepted, jobsFinished: totals.jobsFinished,
            routes: routes, problems: recorder.problems, timeline: recorder.timeline, chaos: chaos,
            fault: fault?.figures(timeline: recorder.timeline, loadSeconds: min(seconds, duration)), invariants: invariants, thresholds: thresholdResults,
            passed: invariants.allSatisfy(\.held) && thresholdResults.allSatisfy(\.passed) && (fault?.succeeded ?? true)
        )
    }
}

/// A count shared by tasks.
final class Counter: Sendable {
    private let count = Mutex(0)
    func increment() { count.withLock { $0 += 1 } }
    func decrement() { count.withLock { $0 -= 1 } }
    var value: Int { count.withLock { $0 } }
}
