import Bus
import BinaryWire
import Foundation
import Logging
import Messages
import NIOCore
import NIOPosix
import ServiceKit
import ZeroMQ

// Bus benchmark: `bus-bench server ENDPOINT` serves an echo method; `bus-bench client ENDPOINT
// [SECONDS]` measures round-trip latency with one request in flight and throughput with 64 in
// flight, with a Codable body of about 200 bytes, for callers on the cooperative pool and for
// callers on the client's I/O executor, and with the services' own hand-written messages (a quota
// reservation and its decision). `bus-bench inproc ENDPOINT` runs both ends in one process;
// `bus-bench handler -` times the handler path alone (decode, handle, encode) without sockets, in
// binary and in JSON; `bus-bench body -` prints the sample's binary body in hex.

struct EchoBody: Codable, Sendable {
    var userId: String
    var jobId: String
    var effectId: String
    var prompt: String
    var cost: Int
    var parameters: [String: Double]
}

let echo = BusMethod<EchoBody, EchoBody>("bench.echo", roles: Set(BusRole.known))
let sample = EchoBody(
    userId: "device:2b7f4c1e-8a53-4f0e-9d55-0c6c1c1a9e77",
    jobId: "4f1c2d9e-6b7a-4c3e-8f21-9a0b1c2d3e4f",
    effectId: "auto-enhance",
    prompt: "brighten the sky a little",
    cost: 1,
    parameters: ["sigma": 1.5, "factor": 2]
)

/// The services' own messages, written by hand (`@BinaryMessage`): a quota reservation as the
/// gateway sends it for each job, answered with the decision quota gives (its status with both
/// windows), made from the request without a ledger, so what is measured is the bus.
let reserve = BusMethod<ReserveQuota, QuotaDecision>("bench.reserve", roles: Set(BusRole.known))
let reservation = ReserveQuota(userId: "device:2b7f4c1e-8a53-4f0e-9d55-0c6c1c1a9e77", jobId: "4f1c2d9e-6b7a-4c3e-8f21-9a0b1c2d3e4f", cost: 1)
let windowStart = Date(timeIntervalSince1970: 1_795_000_000)

func decision(for request: ReserveQuota) -> QuotaDecision {
    func window(_ name: String, _ limit: Int, _ seconds: Int) -> QuotaWindow {
        QuotaWindow(name: name, limit: limit, used: request.cost, remaining: limit - request.cost, startsAt: windowStart,
                    resetsAt: windowStart.addingTimeInterval(Double(seconds)), nominalSeconds: seconds)
    }
    let status = QuotaStatus(userId: request.userId, plan: "free", isPro: false, timeZone: "Europe/Berlin",
                             daily: window("daily", 20, 86_400), monthly: window("monthly", 600, 2_592_000))
    return QuotaDecision(admitted: true, jobId: request.jobId, status: status, violated: [], retryAt: nil)
}

/// One call of the measured kind: the echo of a Codable body, or a reservation.
typealias Call = @Sendable (BusClient) async throws -> Void
let echoCall: Call = { client in _ = try await client.call(echo, sample) }
let reserveCall: Call = { client in _ = try await client.call(reserve, reservation) }

/// Calls one at a time for `seconds`; returns the mean round trip in microseconds.
func latency(client: BusClient, seconds: Double, call: Call = echoCall) async throws -> Double {
    // Warm up: the connection, the JSON coders, the pool.
    for _ in 0..<2000 { try await call(client) }
    var count = 0
    let start = ContinuousClock.now
    while start.duration(to: .now) < .seconds(seconds) {
        try await call(client)
        count += 1
    }
    let elapsed = start.duration(to: .now)
    return (Double(elapsed.components.seconds) * 1e6 + Double(elapsed.components.attoseconds) / 1e12) / Double(count)
}

/// Runs `inFlight` callers in a loop for `seconds`; returns the calls completed per second.
func throughput(client: BusClient, inFlight: Int, seconds: Double, call: @escaping Call = echoCall) async throws -> Double {
    let start = ContinuousClock.now
    let deadline = start.advanced(by: .seconds(seconds))
    let completed = try await withThrowingTaskGroup(of: Int.self) { group in
        for _ in 0..<inFlight {
            group.addTask {
                var count = 0
                while ContinuousClock.now < deadline {
                    try await call(client)
                    count += 1
                }
                return count
            }
        }
        return try await group.reduce(0, +)
    }
    let elapsed = start.duration(to: .now)
    return Double(completed) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

func echoRouter() -> BusRouter {
    var router = BusRouter()
    router.register(echo) { body, _ in body }
    return router
}

/// The sample as a request body in `encoding`.
func sampleBody(_ encoding: BusEncoding) -> [UInt8] {
    encoding == .json ? Array(try! JSONEncoder().encode(sample)) : try! BinaryCoding.encode(sample)
}

func handlerCost(_ router: BusRouter, _ encoding: BusEncoding) async -> Duration {
    let body = sampleBody(encoding)
    let context = BusRequestContext(method: echo.name, traceId: "", deadlineMilliseconds: .max, logger: Logger(label: "bench"))
    let count = 20_000
    let start = ContinuousClock.now
    for _ in 0..<count { _ = await router.handle(method: echo.name, body: body, encoding: encoding, context: context) }
    return start.duration(to: .now) / count
}

let arguments = CommandLine.arguments
guard arguments.count >= 3 else {
    print("usage: bus-bench server|client ENDPOINT [seconds]")
    exit(2)
}
ProcessLogging.bootstrap(level: .warning)
let endpoint = arguments[2]
let seconds = arguments.count > 3 ? Double(arguments[3]) ?? 3 : 3

switch arguments[1] {
case "server":
    // CURVE, and callers known by key, when the environment says so (`make bench-bus`'s curve run).
    let environment = Environment()
    var configuration = BusServer.Configuration(endpoint: endpoint, maxInFlight: 4096, curveSecretKey: try BusSecurity.serverSecretKey(environment))
    if let callers = try BusSecurity.knownCallers(environment) {
        try await BusAuthentication.install(callers: callers, logger: Logger(label: "bench"))
        configuration.knownCallers = true
    }
    var router = BusRouter()
    router.register(echo) { body, _ in body }
    router.register(reserve) { request, _ in decision(for: request) }
    let server = BusServer(configuration: configuration, router: router, logger: Logger(label: "bench"))
    try await server.run()
case "keys":
    // A server key pair and a caller's, for the curve run: SERVER_PUBLIC SERVER_SECRET CALLER_PUBLIC CALLER_SECRET.
    let server = try ZMQCurveKeyPair.generate(), caller = try ZMQCurveKeyPair.generate()
    print("\(server.publicKey) \(server.secretKey) \(caller.publicKey) \(caller.secretKey)")
case "client":
    // (The loop outlives the client: its socket there closes as the client stops.)
    let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    try await withBusClient(.init(endpoint: endpoint, defaultTimeout: .seconds(10), curve: try BusSecurity.clientKeys(Environment()))) { client in
        // Callers as most code makes them: tasks on the cooperative pool, a thread hop each way.
        let latencyMicros = try await latency(client: client, seconds: seconds)
        let poolRate = try await throughput(client: client, inFlight: 64, seconds: seconds)
        // Callers that prefer the client's I/O thread executor: no thread hop at all.
        let executorLatency = try await withTaskExecutorPreference(client.taskExecutor) {
            try await latency(client: client, seconds: seconds)
        }
        let executorRate = try await withTaskExecutorPreference(client.taskExecutor) {
            try await throughput(client: client, inFlight: 64, seconds: seconds)
        }
        // Callers on a NIO event loop, as the gateway's handlers with GATEWAY_TASKS_ON_EVENT_LOOPS:
        // their calls go through the loop's own socket (EventLoopLane).
        let onLoop = EventLoopTaskExecutor(loops.next())
        let loopLatency = try await withTaskExecutorPreference(onLoop) { try await latency(client: client, seconds: seconds) }
        let loopRate = try await withTaskExecutorPreference(onLoop) { try await throughput(client: client, inFlight: 64, seconds: seconds) }
        // The services' hand-written messages, from the pool (not against the C server, which only echoes).
        let echoOnly = ProcessInfo.processInfo.environment["BUS_BENCH_ECHO_ONLY"] == "1"
        let reserveLatency = echoOnly ? 0 : try await latency(client: client, seconds: seconds, call: reserveCall)
        let reserveRate = echoOnly ? 0 : try await throughput(client: client, inFlight: 64, seconds: seconds, call: reserveCall)
        print(String(
            format: "latency_us=%.2f throughput_rps=%.0f executor_latency_us=%.2f executor_throughput_rps=%.0f loop_latency_us=%.2f loop_throughput_rps=%.0f reserve_latency_us=%.2f reserve_throughput_rps=%.0f reserve_bytes=%d decision_bytes=%d",
            latencyMicros, poolRate, executorLatency, executorRate, loopLatency, loopRate, reserveLatency, reserveRate,
            try BinaryCoding.encode(reservation).count, try BinaryCoding.encode(decision(for: reservation)).count
        ))
    }
    try await loops.shutdownGracefully()
case "handler":
    // The handler path alone, no sockets: decode, handle, encode.
    let binary = await handlerCost(echoRouter(), .binary)
    let json = await handlerCost(echoRouter(), .json)
    print(String(
        format: "handler_us=%.2f json_handler_us=%.2f binary_bytes=%d json_bytes=%d",
        Double(binary / .nanoseconds(1)) / 1000, Double(json / .nanoseconds(1)) / 1000,
        sampleBody(.binary).count, sampleBody(.json).count
    ))
case "body":
    // The sample's binary body in hex, for the C client's bus mode.
    print(sampleBody(.binary).map { String(format: "%02x", $0) }.joined())
case "inproc":
    var router = BusRouter()
    router.register(echo) { body, _ in body }
    let server = BusServer(configuration: .init(endpoint: endpoint, maxInFlight: 4096), router: router, logger: Logger(label: "bench"))
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await server.run() }
        try await withBusClient(.init(endpoint: endpoint, defaultTimeout: .seconds(10))) { client in
            let latencyMicros = try await latency(client: client, seconds: seconds)
            let rate = try await throughput(client: client, inFlight: 64, seconds: seconds)
            print(String(format: "inproc latency_us=%.2f throughput_rps=%.0f", latencyMicros, rate))
        }
        group.cancelAll()
    }
default:
    print("usage: bus-bench server|client ENDPOINT [seconds]")
    exit(2)
}
