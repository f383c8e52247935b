import Foundation
import Threads
import Synchronization

/// One fault applied for a set time, then healed: `--fault-command` runs (`/bin/sh -c`) at
/// `--fault-at`, `--heal-command` at `--fault-at` + `--fault-for`. A fault is anything a command
/// can do to the system (scripts/hosts.sh crashes a host, cuts its links, partitions it from the
/// database). Each command's start is an event of the run (`fault`, `heal`), and so is a command
/// that failed (`fault-failed`, `heal-failed`: the run then fails). From the fault to
/// `recovery` seconds after the heal is a window in which 503s and unanswered requests are
/// expected, as after a kill of `--chaos`.
final class Fault: Sendable {
    let name: String
    let command: String
    let healCommand: String
    let at: Double
    let length: Double
    let recovery: Double
    private let recorder: Recorder
    private let state = Mutex<[Chaos.Event]>([])

    init(name: String, command: String, healCommand: String, at: Double, length: Double, recovery: Double, recorder: Recorder) {
        self.name = name
        self.command = command
        self.healCommand = healCommand
        self.at = at
        self.length = length
        self.recovery = recovery
        self.recorder = recorder
    }

    var events: [Chaos.Event] { state.withLock { $0 } }

    /// Whether both commands ran and exited 0.
    var succeeded: Bool { events.map(\.kind) == ["fault", "heal"] }

    /// Applies the fault at its time and heals it `length` later. A cancelled run still heals.
    func run() async {
        try? await Task.sleep(until: recorder.start + .milliseconds(Int(at * 1000)), clock: .continuous)
        guard !Task.isCancelled else { return }
        await perform("fault", command)
        try? await Task.sleep(until: recorder.start + .milliseconds(Int((at + length) * 1000)), clock: .continuous)
        await perform("heal", healCommand)
    }

    private func perform(_ kind: String, _ command: String) async {
        let started = recorder.elapsed()
        let status = await Self.shell(command)
        let event = Chaos.Event(at: started, kind: status == 0 ? kind : "\(kind)-failed", process: name, pid: 0,
                                downtime: kind == "heal" ? started - (events.first?.at ?? started) : nil)
        state.withLock { $0.append(event) }
        if status != 0 { print("loadtest: the \(kind) command exited with status \(status): \(command)") }
    }

    /// The window of expected failures: from the fault to `recovery` after the heal (or after the
    /// run's end, if it never healed).
    func window(runEnd: Double) -> ClosedRange<Double>? {
        guard let fault = events.first(where: { $0.kind.hasPrefix("fault") }) else { return nil }
        let heal = events.first { $0.kind.hasPrefix("heal") }?.at ?? runEnd
        return fault.at...(max(fault.at, heal) + recovery)
    }

    /// Runs `command` with `/bin/sh -c`, its output on this process's, and returns its exit
    /// status (128 + the signal if one ended it). Its end is awaited on a thread of its own
    /// (`waitpid` blocks: `IOThread.run`), off the cooperative pool. (Foundation's `Process` was not used: it sees a process end only when
    /// every descendant has closed a socket it inherits, so a command that starts a daemon never
    /// ended.)
    static func shell(_ command: String) async -> Int32 {
        let arguments: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", command].map { (text: String) in strdup(text) }
        defer { arguments.forEach { free($0) } }
        var pid: pid_t = 0
        guard posix_spawn(&pid, "/bin/sh", nil, nil, arguments + [nil], environ) == 0 else { return 127 }
        let child = pid
        return await IOThread.run(name: "fault-wait") {
            var status: Int32 = 0
            while waitpid(child, &status, 0) == -1 && errno == EINTR {}
            let signal = status & 0x7F
            return signal == 0 ? (status >> 8) & 0xFF : 128 + signal
        }
    }

    /// Availability around the fault, from the run's timeline: the share of requests answered
    /// (anything but a 5xx or no answer) before, during (fault to heal) and after it, and how long
    /// after the heal the system answered successfully at its earlier rate again: the first
    /// second from which three seconds in a row each served at least 90% of the mean successful
    /// requests a second before the fault.
    struct Figures: Codable, Sendable {
        var name: String
        var faultAt: Double
        var healAt: Double
        var requestsBefore: Int
        var requestsDuring: Int
        var requestsAfter: Int
        var successBefore: Double
        var successDuring: Double
        var successAfter: Double
        /// Seconds from the heal; nil when the rate never came back during the run.
        var recoverySeconds: Double?
    }

    func figures(timeline: [String: [Recorder.SecondOfRoute]], loadSeconds: Double) -> Figures? {
        guard let fault = events.first(where: { $0.kind.hasPrefix("fault") }) else { return nil }
        let healAt = events.first { $0.kind.hasPrefix("heal") }?.at ?? loadSeconds
        return Self.figures(name: name, timeline: timeline, faultAt: fault.at, healAt: healAt, loadSeconds: loadSeconds)
    }

    static func figures(name: String, timeline: [String: [Recorder.SecondOfRoute]], faultAt: Double, healAt: Double, loadSeconds: Double) -> Figures {
        var count: [Int: Int] = [:], errors: [Int: Int] = [:]
        for seconds in timeline.values {
            for second in seconds {
                count[second.second, default: 0] += second.count
                errors[second.second, default: 0] += second.errors
            }
        }
        // Second s spans [s, s + 1): it is before the fault if it ends by then, and so on.
        let lastLoadSecond = Int(loadSeconds.rounded(.down)) - 1
        let before = (0...max(0, Int(faultAt.rounded(.down)) - 1)).filter { Double($0 + 1) <= faultAt }
        let during = Array(Int(faultAt.rounded(.down))...max(Int(faultAt.rounded(.down)), Int(healAt.rounded(.up)) - 1))
        let after = Array(stride(from: Int(healAt.rounded(.up)), through: lastLoadSecond, by: 1))
        func requests(_ seconds: [Int]) -> Int { seconds.reduce(0) { $0 + (count[$1] ?? 0) } }
        func share(_ seconds: [Int]) -> Double {
            let total = requests(seconds)
            return total == 0 ? 1 : 1 - Double(seconds.reduce(0) { $0 + (errors[$1] ?? 0) }) / Double(total)
        }
        func served(_ second: Int) -> Double { Double((count[second] ?? 0) - (errors[second] ?? 0)) }
        // The first seconds of a run warm up (sessions start): the rate before is taken from the
        // second half of the time before the fault.
        let steady = before.suffix(max(1, before.count / 2))
        let rate = steady.isEmpty ? 0 : steady.reduce(0) { $0 + served($1) } / Double(steady.count)
        var recovery: Double?
        if let first = after.first {
            for start in first...max(first, lastLoadSecond - 2) where (start...start + 2).allSatisfy({ served($0) >= 0.9 * rate }) {
                recovery = max(0, Double(start) - healAt)
                break
            }
        }
        return Figures(name: name, faultAt: faultAt, healAt: healAt, requestsBefore: requests(before), requestsDuring: requests(during),
                       requestsAfter: requests(after), successBefore: share(before), successDuring: share(during),
                       successAfter: share(after), recoverySeconds: recovery)
    }
}
