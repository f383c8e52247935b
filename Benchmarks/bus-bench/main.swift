import Bus
import Foundation
import Logging
import Messages
import ServiceKit

// Bus benchmark: `bus-bench server ENDPOINT` serves an echo method; `bus-bench client ENDPOINT`
// measures round-trip latency with one request in flight and throughput with 64 in flight, with a
// Codable body of about 200 bytes, and prints `latency_us=X throughput_rps=Y`.

struct EchoBody: Codable, Sendable {
    var userId: String
    var jobId: String
    var effectId: String
    var prompt: String
    var cost: Int
    var parameters: [String: Double]
}

let echo = BusMethod<EchoBody, EchoBody>("bench.echo")
let sample = EchoBody(
    userId: "device:2b7f4c1e-8a53-4f0e-9d55-0c6c1c1a9e77",
    jobId: "4f1c2d9e-6b7a-4c3e-8f21-9a0b1c2d3e4f",
    effectId: "auto-enhance",
    prompt: "brighten the sky a little",
    cost: 1,
    parameters: ["sigma": 1.5, "factor": 2]
)

/// Calls one at a time for `seconds`; returns the mean round trip in microseconds.
func latency(client: BusClient, seconds: Double) async throws -> Double {
    // Warm up: the connection, the JSON coders, the pool.
    for _ in 0..<2000 { _ = try await client.call(echo, sample) }
    var count = 0
    let start = ContinuousClock.now
    while start.duration(to: .now) < .seconds(seconds) {
        _ = try await client.call(echo, sample)
        count += 1
    }
    let elapsed = start.duration(to: .now)
    return (Double(elapsed.components.seconds) * 1e6 + Double(elapsed.components.attoseconds) / 1e12) / Double(count)
}

/// Runs `inFlight` callers in a loop until `deadline`; returns how many calls completed.
func throughput(client: BusClient, inFlight: Int, until deadline: ContinuousClock.Instant) async throws -> Int {
    try await withThrowingTaskGroup(of: Int.self) { group in
        for _ in 0..<inFlight {
            group.addTask {
                var count = 0
                while ContinuousClock.now < deadline {
                    _ = try await client.call(echo, sample)
                    count += 1
                }
                return count
            }
        }
        return try await group.reduce(0, +)
    }
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
    var router = BusRouter()
    router.register(echo) { body, _ in body }
    let server = BusServer(configuration: .init(endpoint: endpoint, maxInFlight: 4096), router: router, logger: Logger(label: "bench"))
    try await server.run()
case "client":
    let client = BusClient(endpoint: endpoint, timeout: .seconds(10))
    let clock = ContinuousClock()
    let latencyMicros = try await latency(client: client, seconds: seconds)
    let throughputStart = clock.now
    let completed = try await throughput(client: client, inFlight: 64, until: throughputStart.advanced(by: .seconds(seconds)))
    let throughputElapsed = throughputStart.duration(to: clock.now)
    let elapsedSeconds = Double(throughputElapsed.components.seconds) + Double(throughputElapsed.components.attoseconds) / 1e18
    print(String(format: "latency_us=%.2f throughput_rps=%.0f", latencyMicros, Double(completed) / elapsedSeconds))
    await client.shutdown()
case "inproc":
    var router = BusRouter()
    router.register(echo) { body, _ in body }
    let server = BusServer(configuration: .init(endpoint: endpoint, maxInFlight: 4096), router: router, logger: Logger(label: "bench"))
    let serverTask = Task { try await server.run() }
    let client = BusClient(endpoint: endpoint, timeout: .seconds(10))
    let latencyMicros = try await latency(client: client, seconds: seconds)
    let completed = try await throughput(client: client, inFlight: 64, until: .now.advanced(by: .seconds(seconds)))
    print(String(format: "inproc latency_us=%.2f throughput_rps=%.0f", latencyMicros, Double(completed) / seconds))
    serverTask.cancel()
default:
    print("usage: bus-bench server|client ENDPOINT [seconds]")
    exit(2)
}
