import Bus
import Foundation
import Messages
import ServiceKit
import Synchronization

/// One of the project's executables started as a real process for a test, its output in a file.
final class ServiceProcess: @unchecked Sendable {
    // @unchecked: Process is used from the test's task only; the log path is immutable.
    let name: String
    let process = Process()
    let logURL: URL

    /// Where `swift build` put the executables: beside the test bundle, or `BIN_DIR`.
    static var binaryDirectory: URL {
        if let dir = ProcessInfo.processInfo.environment["BIN_DIR"] { return URL(fileURLWithPath: dir) }
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return exe.deletingLastPathComponent()
    }

    /// Starts `executable` with `environment` added to this process's own; through `wrapper`
    /// (a command that ends by executing its last argument, as `ip netns exec NS ...` does) when
    /// one is given.
    init(_ executable: String, wrappedBy wrapper: [String] = [], environment: [String: String]) throws {
        name = executable
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent("\(executable)-\(UUID().uuidString).log")
        _ = FileManager.default.createFile(atPath: logURL.path, contents: nil)
        let log = try FileHandle(forWritingTo: logURL)
        let binary = Self.binaryDirectory.appendingPathComponent(executable)
        if let tool = wrapper.first {
            process.executableURL = URL(fileURLWithPath: tool)
            process.arguments = Array(wrapper.dropFirst()) + [binary.path]
        } else {
            process.executableURL = binary
        }
        var env = ProcessInfo.processInfo.environment
        // Debug: tests read the per-request and per-job lines (request ids, job ids).
        env["LOG_LEVEL"] = env["TEST_LOG_LEVEL"] ?? "debug"
        // A test run that crashes leaves no service behind (`ProcessExit`).
        env["EXIT_WITH_PARENT"] = "\(getpid())"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.standardOutput = log
        process.standardError = log
        try process.run()
    }

    /// A test that throws half-way leaves no process behind; nor does any test leave its log
    /// (a failing test prints what it needs of it; a run that crashes never gets here and keeps
    /// them all).
    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(at: logURL)
    }

    var pid: Int32 { process.processIdentifier }

    /// Sends `signal` to the process.
    func signal(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits (without blocking a pool thread) for the process to exit; nil if it is still running.
    func waitForExit(within limit: Duration = .seconds(10)) async throws -> Int32? {
        try await Self.waitForExit(of: process, within: limit)
    }

    /// Waits (without blocking a pool thread) for `process` to exit; nil if it still runs after
    /// `limit`.
    static func waitForExit(of process: Process, within limit: Duration) async throws -> Int32? {
        let deadline = ContinuousClock.now.advanced(by: limit)
        while process.isRunning {
            if let status = exitStatus(ofExited: process.processIdentifier) { return status }
            if ContinuousClock.now >= deadline { return nil }
            try await Task.sleep(for: .milliseconds(20))
        }
        return process.terminationStatus
    }

    /// The status of a child that has exited though `Process` has not noticed yet, read without
    /// reaping it (`WNOWAIT`: `Process` reaps it when it does notice). `Process` on Linux learns of
    /// an exit when a socket the child inherited closes, and a process spawned by another test at
    /// the same moment can inherit that socket too and keep it open for as long as it runs
    /// (swift-corelibs-foundation#4795): a refused service was once "running" for 20 s after it
    /// had exited. Nil while the child runs. Like `terminationStatus`: the exit code, or the signal.
    static func exitStatus(ofExited pid: Int32) -> Int32? {
        var info = siginfo_t()
        guard waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0, info._sifields._sigchld.si_pid == pid else { return nil }
        return info._sifields._sigchld.si_status
    }

    /// Stops the process if it still runs: SIGTERM, then SIGKILL.
    func stop() async {
        guard process.isRunning else { return }
        signal(SIGTERM)
        if (try? await waitForExit(within: .seconds(5))) == nil {
            signal(SIGKILL)
            _ = try? await waitForExit(within: .seconds(5))
        }
    }

    /// What the process has written so far.
    var output: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }

    /// Runs the tool at `path` with `arguments` to its end and returns its status and what it
    /// wrote (its output goes to a file: nothing waits on a pipe). It waits as `waitForExit` does,
    /// never blocking a thread of the cooperative pool: `Process.waitUntilExit()` there held one
    /// for as long as another test's child kept the socket `Process` watches, and with both
    /// of a 2-core machine's pool threads held, every other test in the process stood still.
    static func runToEnd(_ path: String, _ arguments: [String], environment: [String: String]? = nil,
                         within limit: Duration = .seconds(300)) async throws -> (status: Int32, output: String) {
        let logURL = FileManager.default.temporaryDirectory.appendingPathComponent("tool-\(UUID().uuidString).log")
        _ = FileManager.default.createFile(atPath: logURL.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: logURL) }
        let log = try FileHandle(forWritingTo: logURL)
        defer { try? log.close() }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        if let environment { process.environment = environment }
        process.standardOutput = log
        process.standardError = log
        try process.run()
        guard let status = try await waitForExit(of: process, within: limit) else {
            kill(process.processIdentifier, SIGKILL)
            throw ToolFailed(description: "\(path) \(arguments.joined(separator: " ")) did not end within \(limit)")
        }
        return (status, (try? String(contentsOf: logURL, encoding: .utf8)) ?? "")
    }
}

/// Runs a short command (`arguments[0]` a path, or a name looked up in PATH) to its end with
/// posix_spawn and waitpid, not `Process`: it returns when the command exits, whatever another
/// test's child does with the socket `Process` watches (see `exitStatus(ofExited:)`), and the
/// child is reaped by then (its pid free). Its status (the exit code, or 128 + the signal) and
/// what it wrote. It blocks its thread for the command's own time: for quick tools only (`ip`,
/// `mount`), from code that cannot await.
@discardableResult
func runQuickCommand(_ arguments: [String]) -> (status: Int32, output: String, pid: Int32) {
    let logPath = FileManager.default.temporaryDirectory.appendingPathComponent("command-\(UUID().uuidString).log").path
    defer { unlink(logPath) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, logPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    var pid: pid_t = 0
    let argv = arguments.map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    guard posix_spawnp(&pid, arguments[0], &actions, nil, argv, environ) == 0 else {
        return (-1, "cannot run \(arguments[0])", 0)
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
    let exited = status & 0x7F == 0
    let code = exited ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    return (code, (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "", pid)
}

struct ToolFailed: Error, CustomStringConvertible {
    var description: String
}

/// Waits until the service at `endpoint` answers `health`.
func waitUntilHealthy(_ client: BusClient, within limit: Duration = .seconds(20)) async throws -> HealthReport {
    let deadline = ContinuousClock.now.advanced(by: limit)
    while true {
        do {
            return try await client.call(Health.check, Empty(), timeout: .milliseconds(500))
        } catch {
            if ContinuousClock.now >= deadline { throw error }
            try await Task.sleep(for: .milliseconds(50))
        }
    }
}

/// A TCP port on loopback that nothing listens on right now, and that no other call in this test
/// run returns. Ports come from below the kernel's ephemeral range (32768 and up on Linux): an
/// ephemeral port handed out by the kernel may be taken a moment later by an outgoing
/// connection, and a service started on it would fail to bind.
func freePort() -> Int {
    while true {
        let candidate = PortPicker.next()
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let bound = bindLoopback(fd, port: candidate)
        close(fd)
        if bound == 0 { return candidate }
    }
}

/// Binds the TCP socket `fd` to 127.0.0.1:`port`; `bind`'s result.
func bindLoopback(_ fd: Int32, port: Int) -> Int32 {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
}

/// Hands out the ports `freePort` tries, in turn, from a start that differs between runs.
enum PortPicker {
    static let range = 20_000..<32_000
    private static let counter = Mutex(Int(getpid()) &* 7_919 % 12_000)

    static func next() -> Int {
        counter.withLock { value in
            value = (value + 1) % range.count
            return range.lowerBound + value
        }
    }
}

/// The three services as real processes on free loopback ports, each with its own data folder.
final class RunningServices: @unchecked Sendable {
    // @unchecked: mutated only by the test that owns it, one step at a time.
    var processes: [ServiceName: ServiceProcess] = [:]
    let endpoints: [ServiceName: String]
    /// The endpoints as a caller's variables (`QUOTA_ENDPOINT`, …).
    var endpointVariables: [String: String] {
        Dictionary(uniqueKeysWithValues: endpoints.map { ($0.key.endpointVariable, $0.value) })
    }
    let dataDirectory: URL

    /// Starts `only` those services (all by default), each on a free port, their data in
    /// `dataDirectory` (a fresh temporary folder by default).
    init(only: [ServiceName] = ServiceName.allCases, dataDirectory: URL? = nil) throws {
        endpoints = Dictionary(uniqueKeysWithValues: ServiceName.allCases.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        self.dataDirectory = dataDirectory ?? FileManager.default.temporaryDirectory.appendingPathComponent("data-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: self.dataDirectory, withIntermediateDirectories: true)
        for service in only { try start(service) }
    }

    /// The extra variables each service was last started with, for `restart`.
    var extras: [ServiceName: [String: String]] = [:]

    /// Starts `service` on its endpoint, with its other endpoints on free ports too (so tests
    /// running side by side never share one) and `extra` variables on top.
    func start(_ service: ServiceName, extra: [String: String] = [:]) throws {
        var environment = [
            service.bindVariable: endpoints[service]!,
            "DATA_DIR": dataDirectory.path,
        ]
        for other in ServiceName.allCases where other != service {
            environment[other.endpointVariable] = endpoints[other]!
        }
        if service == .jobs {
            environment["JOBS_WORKER_BIND"] = "tcp://127.0.0.1:\(freePort())"
        }
        extras[service] = extra
        processes[service] = try ServiceProcess(service.rawValue, environment: environment.merging(extra) { _, new in new })
    }

    /// Stops `service` (SIGTERM, then SIGKILL).
    func stop(_ service: ServiceName) async {
        await processes[service]?.stop()
    }

    /// Starts `service` again with the variables it was first started with.
    func restart(_ service: ServiceName) throws {
        try start(service, extra: extras[service] ?? [:])
    }

    func stopAll() async {
        for process in processes.values { await process.stop() }
        try? FileManager.default.removeItem(at: dataDirectory)
    }
}
