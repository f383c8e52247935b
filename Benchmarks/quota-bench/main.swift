import Bus
import Foundation
import Messages
import ServiceKit

// Quota benchmark client: `quota-bench ENDPOINT [SECONDS] [CALLERS]` sends reserves for random
// users (each with a fresh job id) from CALLERS concurrent callers for SECONDS against a running
// quota service, and prints `decisions_per_s=X p50_ms=Y p99_ms=Z admitted=A denied=D`.

struct Tally: Sendable {
    var latencies: [Double] = []
    var admitted = 0
    var denied = 0
}

func caller(client: BusClient, until deadline: ContinuousClock.Instant, users: Int) async throws -> Tally {
    var tally = Tally()
    tally.latencies.reserveCapacity(100_000)
    while ContinuousClock.now < deadline {
        // A job id as the gateway mints it (time-ordered).
        let request = ReserveQuota(userId: "bench-user-\(Int.random(in: 0..<users))", jobId: TimeOrderedID.make())
        let started = ContinuousClock.now
        let decision = try await client.call(Quota.reserve, request)
        let elapsed = started.duration(to: .now)
        tally.latencies.append(Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)
        if decision.admitted { tally.admitted += 1 } else { tally.denied += 1 }
    }
    return tally
}

func run(endpoint: String, seconds: Double, callers: Int) async throws {
    ProcessLogging.bootstrap(level: .warning)
    try await withBusClient(.init(endpoint: endpoint, defaultTimeout: .seconds(30))) { client in
        // Warm up the connection and the service.
        for _ in 0..<200 { _ = try await client.call(Quota.reserve, ReserveQuota(userId: "warmup-\(UUID().uuidString)", jobId: UUID().uuidString)) }
        let start = ContinuousClock.now
        let deadline = start.advanced(by: .seconds(seconds))
        let total = try await withThrowingTaskGroup(of: Tally.self) { group in
            for _ in 0..<callers {
                group.addTask { try await caller(client: client, until: deadline, users: 100_000) }
            }
            return try await group.reduce(into: Tally()) { total, part in
                total.latencies += part.latencies
                total.admitted += part.admitted
                total.denied += part.denied
            }
        }
        let elapsed = start.duration(to: .now)
        let elapsedSeconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let sorted = total.latencies.sorted()
        func percentile(_ p: Double) -> Double { sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }
        print(String(
            format: "decisions_per_s=%.0f p50_ms=%.3f p99_ms=%.3f admitted=%d denied=%d",
            Double(sorted.count) / elapsedSeconds, percentile(0.50), percentile(0.99), total.admitted, total.denied
        ))
    }
}

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    print("usage: quota-bench ENDPOINT [SECONDS] [CALLERS]")
    exit(2)
}
try await run(
    endpoint: arguments[1],
    seconds: arguments.count > 2 ? Double(arguments[2]) ?? 5 : 5,
    callers: arguments.count > 3 ? Int(arguments[3]) ?? 64 : 64
)
