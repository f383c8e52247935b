import Foundation
import Histogram
import Synchronization

/// Everything measured during a run: per route and status, latencies in HdrHistograms (in
/// microseconds, from each request's planned start); per second, each route's count, errors and
/// p50/p99; every 5xx and every failed connection with its time (for the invariants); errors by
/// problem type; and the jobs the virtual users saw accepted and finished.
final class Recorder: Sendable {
    /// The outcome of one request: an HTTP status, or `0` when no answer came (refused
    /// connection, reset, timeout).
    struct Key: Hashable, Comparable, Sendable {
        var route: String
        var status: Int
        static func < (lhs: Key, rhs: Key) -> Bool { (lhs.route, lhs.status) < (rhs.route, rhs.status) }
    }

    /// One second of one route.
    struct SecondOfRoute: Codable, Sendable {
        var second: Int
        var count: Int
        var errors: Int
        var p50Ms: Double
        var p99Ms: Double
    }

    /// A request that failed on the server's side or never got an answer.
    struct Failure: Codable, Sendable {
        /// Seconds since the start of the run.
        var at: Double
        var route: String
        /// The HTTP status, 0 for no answer.
        var status: Int
        var detail: String
    }

    struct Totals: Sendable {
        var requests = 0
        var errors = 0
        var jobsAccepted = 0
        var jobsFinished = 0
    }

    private struct State {
        var histograms: [Key: Histogram<UInt64>] = [:]
        var routeHistograms: [String: Histogram<UInt64>] = [:]
        var problems: [String: Int] = [:]
        var failures: [Failure] = []
        var failuresDropped = 0
        var current: [String: [UInt64]] = [:]
        var currentErrors: [String: Int] = [:]
        var timeline: [String: [SecondOfRoute]] = [:]
        var lastSecondP99: Double = 0
        var totals = Totals()
        var droppedSessions = 0
    }

    private let state = Mutex(State())
    let start: ContinuousClock.Instant
    /// Failures kept with their details (the rest are counted).
    static let maxFailuresKept = 100_000

    /// Requests at most; past it sessions send no more (`full`).
    let maxRequests: Int

    init(start: ContinuousClock.Instant, maxRequests: Int = 1_000_000) {
        self.start = start
        self.maxRequests = maxRequests
    }

    /// Whether the run has sent its most requests.
    var full: Bool { state.withLock { $0.totals.requests >= maxRequests } }

    static func newHistogram() -> Histogram<UInt64> {
        // 1 µs to 10 minutes, three significant digits.
        Histogram<UInt64>(lowestDiscernibleValue: 1, highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: .three)
    }

    /// Seconds since the start of the run.
    func elapsed(_ instant: ContinuousClock.Instant = .now) -> Double {
        let duration = start.duration(to: instant)
        return Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// Whether `status` counts as an error: no answer, or a 5xx.
    static func isError(_ status: Int) -> Bool { status == 0 || status >= 500 }

    /// Records one request of `route` that ended now, planned for `planned`.
    func record(route: String, status: Int, planned: ContinuousClock.Instant, problem: String?, detail: @autoclosure () -> String = "") {
        let now = ContinuousClock.now
        let latency = max(1, UInt64(planned.duration(to: now) / .microseconds(1)))
        let isError = Self.isError(status)
        let failure = isError ? Failure(at: elapsed(now), route: route, status: status, detail: String(detail().prefix(300))) : nil
        state.withLock { state in
            let key = Key(route: route, status: status)
            if state.histograms[key] == nil { state.histograms[key] = Self.newHistogram() }
            _ = state.histograms[key]!.record(min(latency, 600_000_000))
            if state.routeHistograms[route] == nil { state.routeHistograms[route] = Self.newHistogram() }
            _ = state.routeHistograms[route]!.record(min(latency, 600_000_000))
            state.current[route, default: []].append(latency)
            state.totals.requests += 1
            if isError {
                state.totals.errors += 1
                state.currentErrors[route, default: 0] += 1
            }
            if let problem, status >= 400 || status == 0 {
                state.problems["\(status) \(problem)", default: 0] += 1
            }
            if let failure {
                if state.failures.count < Self.maxFailuresKept { state.failures.append(failure) } else { state.failuresDropped += 1 }
            }
        }
    }

    func jobAccepted() { state.withLock { $0.totals.jobsAccepted += 1 } }
    func jobFinished() { state.withLock { $0.totals.jobsFinished += 1 } }
    func sessionDropped() { state.withLock { $0.droppedSessions += 1 } }

    /// Closes second `second` of the timeline: each route's count, errors and percentiles.
    /// Returns the requests and errors of that second and its p99 over all routes (ms).
    @discardableResult
    func closeSecond(_ second: Int) -> (requests: Int, errors: Int, p99Ms: Double) {
        state.withLock { state in
            var all: [UInt64] = []
            var errors = 0
            for (route, latencies) in state.current {
                let sorted = latencies.sorted()
                let routeErrors = state.currentErrors[route] ?? 0
                errors += routeErrors
                all += sorted
                state.timeline[route, default: []].append(SecondOfRoute(
                    second: second, count: sorted.count, errors: routeErrors,
                    p50Ms: Self.percentile(sorted, 50), p99Ms: Self.percentile(sorted, 99)
                ))
            }
            state.current.removeAll(keepingCapacity: true)
            state.currentErrors.removeAll(keepingCapacity: true)
            all.sort()
            let p99 = Self.percentile(all, 99)
            state.lastSecondP99 = p99
            return (all.count, errors, p99)
        }
    }

    static func percentile(_ sorted: [UInt64], _ p: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        let index = min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1)
        return Double(sorted[max(0, index)]) / 1000
    }

    var totals: Totals { state.withLock { $0.totals } }
    var droppedSessions: Int { state.withLock { $0.droppedSessions } }
    var failures: [Failure] { state.withLock { $0.failures } }
    var problems: [String: Int] { state.withLock { $0.problems } }
    var histograms: [Key: Histogram<UInt64>] { state.withLock { $0.histograms } }
    var routeHistograms: [String: Histogram<UInt64>] { state.withLock { $0.routeHistograms } }
    var timeline: [String: [SecondOfRoute]] { state.withLock { $0.timeline } }
}
