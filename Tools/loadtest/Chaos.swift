import Foundation
import Synchronization

/// Kills one process of the local stack every `interval` with SIGKILL, picked at random among the
/// workers, jobs, quota, history (and their replicas), the gateway (and radosgw, the local S3
/// server of `BLOB_STORE=s3 make run`, and postgres, the local PostgreSQL of `STORE=postgres make
/// run`), from the pid files `make run` keeps in
/// `$DATA_DIR/pids` (one `NAME.pid` per supervised process). After each kill it waits for the
/// supervisor to start the process again (a new pid, alive) before the next, so one process at a
/// time is down. Each kill and restart is an event of the run; the time from a kill to a few
/// seconds after its restart is a window in which 503s and refused connections are expected.
final class Chaos: Sendable {
    struct Event: Codable, Sendable {
        /// Seconds since the start of the run.
        var at: Double
        /// `kill` or `restart`, or `not-restarted` when no new process came in time.
        var kind: String
        var process: String
        var pid: Int32
        /// For a restart: seconds since the kill.
        var downtime: Double?
    }

    let directory: URL
    let interval: Duration
    /// Seconds after a restart during which its effects (reconnections, readiness) still count
    /// as the process being down.
    static let recovery = 10.0
    /// The longest wait for a killed process to come back.
    static let restartLimit = Duration.seconds(60)
    private let recorder: Recorder
    private let state = Mutex<[Event]>([])
    private let names: Set<String>
    /// The processes killed first, in this order, if named; the rest are picked at random.
    private let first: [String]

    init(directory: URL, interval: Duration, recorder: Recorder, only names: Set<String> = [], first: [String] = []) {
        self.directory = directory
        self.interval = interval
        self.recorder = recorder
        self.names = names
        self.first = first
    }

    var events: [Event] { state.withLock { $0 } }

    /// The stack's processes and their pids, from the pid files, alive ones only.
    func processes() -> [(name: String, pid: Int32)] {
        let files = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return files.filter { $0.hasSuffix(".pid") }.sorted().compactMap { file in
            let name = String(file.dropLast(4))
            guard Self.isTarget(name), names.isEmpty || names.contains(name) || names.contains(Self.kind(of: name)),
                  let pid = Self.pid(in: directory.appendingPathComponent(file)), kill(pid, 0) == 0 else { return nil }
            return (name, pid)
        }
    }

    /// The stack's processes: the services and their replicas (`quota-2`), workers, and the
    /// local servers (`radosgw`, `postgres`).
    static func isTarget(_ name: String) -> Bool {
        ["gateway", "quota", "history", "jobs", "radosgw", "postgres", "worker"].contains(kind(of: name))
    }

    /// A process's kind: its name without a replica's or worker's number (`quota-2` is a quota).
    static func kind(of name: String) -> String {
        guard let dash = name.lastIndex(of: "-"), name[name.index(after: dash)...].allSatisfy(\.isNumber), dash != name.startIndex else { return name }
        return String(name[..<dash])
    }

    static func pid(in file: URL) -> Int32? {
        (try? String(contentsOf: file, encoding: .utf8)).flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Kills and waits for restarts until `end`.
    func run(until end: ContinuousClock.Instant, seed: UInt64) async {
        var rng = SeededGenerator(seed: seed)
        while true {
            let due = ContinuousClock.now + interval
            guard due < end else { return }
            try? await Task.sleep(until: due, clock: .continuous)
            if Task.isCancelled { return }
            let candidates = processes()
            let kills = events.filter { $0.kind == "kill" }.count
            let named = kills < first.count ? candidates.first { $0.name == first[kills] } : nil
            guard let victim = named ?? candidates.randomElement(using: &rng) else { continue }
            // The time is read before the signal: a failure the kill causes is recorded after it even
            // when this thread is preempted between the two calls on a busy machine.
            let killedAt = recorder.elapsed()
            guard kill(victim.pid, SIGKILL) == 0 else { continue }
            add(Event(at: killedAt, kind: "kill", process: victim.name, pid: victim.pid))
            await waitForRestart(of: victim, killedAt: killedAt)
        }
    }

    private func waitForRestart(of victim: (name: String, pid: Int32), killedAt: Double) async {
        let file = directory.appendingPathComponent("\(victim.name).pid")
        let deadline = ContinuousClock.now + Self.restartLimit
        while ContinuousClock.now < deadline {
            if let pid = Self.pid(in: file), pid != victim.pid, kill(pid, 0) == 0 {
                let now = recorder.elapsed()
                add(Event(at: now, kind: "restart", process: victim.name, pid: pid, downtime: now - killedAt))
                return
            }
            try? await Task.sleep(for: .milliseconds(100))
        }
        add(Event(at: recorder.elapsed(), kind: "not-restarted", process: victim.name, pid: victim.pid))
    }

    private func add(_ event: Event) {
        state.withLock { $0.append(event) }
    }

    /// The spans, in seconds since the start, when a process was down or recovering.
    func downWindows(runEnd: Double) -> [ClosedRange<Double>] {
        Self.windows(of: events, runEnd: runEnd)
    }

    /// From each kill to `recovery` seconds after the next restart (or after the run's end).
    static func windows(of events: [Event], runEnd: Double) -> [ClosedRange<Double>] {
        var windows: [ClosedRange<Double>] = []
        var open: Double?
        for event in events {
            switch event.kind {
            case "kill": open = event.at
            default:
                if let start = open { windows.append(start...(event.at + recovery)) }
                open = nil
            }
        }
        if let start = open { windows.append(start...(runEnd + recovery)) }
        return windows
    }
}
