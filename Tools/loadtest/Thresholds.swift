import Foundation
import Histogram

/// A pass/fail criterion on the run's figures, as k6 has them: `[ROUTE ]METRIC OP VALUE[UNIT]`,
/// such as `POST /api/v1/jobs p99<50ms`, `errors<0.1%`, `GET /api/v1/users/me rate>10`.
/// Metrics: `p50`, `p90`, `p99`, `p99.9`, `max`, `mean` (units `us`, `ms`, `s`; default ms),
/// `errors` (with `%`, a share of requests; without, a count), `rate` (requests a second).
/// Without a route, the figure is over every route.
struct Threshold: Sendable, CustomStringConvertible {
    var route: String?
    var metric: String
    var op: String
    var value: Double
    var unit: String
    var description: String

    init(_ text: String) throws {
        description = text
        let pattern = /^(?:(.+?)\s+)?(p50|p90|p99|p99\.9|max|mean|errors|rate)\s*(<=|>=|<|>)\s*([0-9]+(?:\.[0-9]+)?)\s*(us|µs|ms|s|%|\/s)?$/
        guard let match = text.trimmingCharacters(in: .whitespaces).wholeMatch(of: pattern), let value = Double(match.4) else {
            throw UsageError("threshold '\(text)': expected '[ROUTE ]METRIC OP VALUE[UNIT]', e.g. 'POST /api/v1/jobs p99<50ms' or 'errors<0.1%'")
        }
        route = match.1.map(String.init)
        metric = String(match.2)
        op = String(match.3)
        self.value = value
        unit = match.5.map(String.init) ?? (metric == "errors" ? "" : metric == "rate" ? "/s" : "ms")
        let isLatency = ["p50", "p90", "p99", "p99.9", "max", "mean"].contains(metric)
        let fits = isLatency ? ["us", "µs", "ms", "s"].contains(unit) : metric == "errors" ? ["", "%"].contains(unit) : unit == "/s"
        guard fits else { throw UsageError("threshold '\(text)': unit '\(unit)' does not fit \(metric)") }
    }

    struct Result: Codable, Sendable {
        var threshold: String
        var actual: Double
        var unit: String
        var passed: Bool
    }

    /// Evaluates the threshold against the run's figures.
    func evaluate(histograms: [String: Histogram<UInt64>], requests: [String: Int], errors: [String: Int], seconds: Double) -> Result {
        let routes = route.map { [$0] } ?? Array(requests.keys)
        let count = routes.reduce(0) { $0 + (requests[$1] ?? 0) }
        let failed = routes.reduce(0) { $0 + (errors[$1] ?? 0) }
        let actual: Double
        switch metric {
        case "errors": actual = unit == "%" ? (count == 0 ? 0 : Double(failed) * 100 / Double(count)) : Double(failed)
        case "rate": actual = seconds > 0 ? Double(count) / seconds : 0
        default:
            var merged = Recorder.newHistogram()
            for route in routes { if let histogram = histograms[route] { merged.add(histogram) } }
            let micros: Double = switch metric {
            case "p50": Double(merged.valueAtPercentile(50))
            case "p90": Double(merged.valueAtPercentile(90))
            case "p99": Double(merged.valueAtPercentile(99))
            case "p99.9": Double(merged.valueAtPercentile(99.9))
            case "max": Double(merged.max)
            default: merged.mean
            }
            actual = switch unit {
            case "us", "µs": micros
            case "s": micros / 1_000_000
            default: micros / 1000
            }
        }
        let passed = switch op {
        case "<": actual < value
        case "<=": actual <= value
        case ">": actual > value
        default: actual >= value
        }
        // A route with no requests cannot pass a latency or rate threshold.
        let vacuous = count == 0 && metric != "errors"
        return Result(threshold: description, actual: actual, unit: unit, passed: passed && !vacuous)
    }
}
