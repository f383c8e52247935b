import Foundation
import Histogram

/// Every figure of a run: what `--json` writes and what the summary and `--report` show.
struct RunSummary: Codable, Sendable {
    struct Latency: Codable, Sendable {
        var count: Int
        var p50Ms, p90Ms, p99Ms, p999Ms, maxMs, meanMs: Double
    }

    struct Route: Codable, Sendable {
        var route: String
        var requestsPerSecond: Double
        var errors: Int
        var latency: Latency
        /// Status (0: no answer) to its count and latency.
        var statuses: [String: Latency]
        /// (percentile, milliseconds) points of the latency distribution.
        var distribution: [[Double]]
    }

    var target: String
    var model: String
    var startedAt: String
    var seconds: Double
    var seed: UInt64
    var sessions: Int
    var droppedSessions: Int
    var requests: Int
    var errors: Int
    var requestsPerSecond: Double
    var jobsAccepted: Int
    var jobsFinished: Int
    var routes: [Route]
    /// "STATUS problem-code" to count.
    var problems: [String: Int]
    var timeline: [String: [Recorder.SecondOfRoute]]
    var chaos: [Chaos.Event]
    /// With --fault-command: availability before, during and after the fault.
    var fault: Fault.Figures?
    var invariants: [InvariantResult]
    var thresholds: [Threshold.Result]
    var passed: Bool

    static func latency(_ histogram: Histogram<UInt64>) -> Latency {
        Latency(count: Int(histogram.totalCount),
                p50Ms: Double(histogram.valueAtPercentile(50)) / 1000, p90Ms: Double(histogram.valueAtPercentile(90)) / 1000,
                p99Ms: Double(histogram.valueAtPercentile(99)) / 1000, p999Ms: Double(histogram.valueAtPercentile(99.9)) / 1000,
                maxMs: Double(histogram.max) / 1000, meanMs: histogram.mean / 1000)
    }

    static func distribution(_ histogram: Histogram<UInt64>) -> [[Double]] {
        [0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 100].map { [$0, Double(histogram.valueAtPercentile($0)) / 1000] }
    }
}

/// Writes the summary as text, the JSON file and the HTML report.
enum Report {
    static func ms(_ value: Double) -> String {
        value >= 1000 ? String(format: "%.2f s", value / 1000) : value >= 10 ? String(format: "%.0f ms", value) : String(format: "%.1f ms", value)
    }

    static func pad(_ text: String, _ width: Int, right: Bool = false) -> String {
        let count = text.count
        guard count < width else { return text }
        let space = String(repeating: " ", count: width - count)
        return right ? space + text : text + space
    }

    /// The table printed at the end of a run.
    static func text(_ summary: RunSummary) -> String {
        var lines: [String] = []
        lines.append(String(format: "%d requests in %.0f s (%.1f req/s), %d errors; %d sessions (%d dropped); jobs: %d accepted, %d seen finished",
                            summary.requests, summary.seconds, summary.requestsPerSecond, summary.errors, summary.sessions,
                            summary.droppedSessions, summary.jobsAccepted, summary.jobsFinished))
        lines.append("")
        let header = [pad("route", 38), pad("req/s", 7, right: true), pad("p50", 9, right: true), pad("p90", 9, right: true),
                      pad("p99", 9, right: true), pad("p99.9", 9, right: true), pad("max", 9, right: true), "  statuses"]
        lines.append(header.joined(separator: " "))
        for route in summary.routes {
            let statuses = route.statuses.sorted { $0.key < $1.key }.map { "\($0.key == "0" ? "none" : $0.key)×\($0.value.count)" }.joined(separator: " ")
            let l = route.latency
            lines.append([pad(route.route, 38), pad(String(format: "%.1f", route.requestsPerSecond), 7, right: true),
                          pad(ms(l.p50Ms), 9, right: true), pad(ms(l.p90Ms), 9, right: true), pad(ms(l.p99Ms), 9, right: true),
                          pad(ms(l.p999Ms), 9, right: true), pad(ms(l.maxMs), 9, right: true), "  " + statuses].joined(separator: " "))
        }
        if !summary.problems.isEmpty {
            lines.append("")
            lines.append("problems: " + summary.problems.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" }.joined(separator: ", "))
        }
        if summary.chaos.contains(where: { $0.kind == "kill" }) {
            let kills = summary.chaos.filter { $0.kind == "kill" }
            let restarts = summary.chaos.filter { $0.kind == "restart" }
            lines.append("")
            lines.append("chaos: \(kills.count) kills, \(restarts.count) restarts: " + kills.map { String(format: "%@ at %.0f s", $0.process, $0.at) }.joined(separator: ", "))
        }
        if let fault = summary.fault {
            lines.append("")
            lines.append(String(format: "fault %@ from %.1f s to %.1f s: answered %.1f%% of %d requests before, %.1f%% of %d during, %.1f%% of %d after; earlier rate back %@",
                                fault.name, fault.faultAt, fault.healAt, 100 * fault.successBefore, fault.requestsBefore,
                                100 * fault.successDuring, fault.requestsDuring, 100 * fault.successAfter, fault.requestsAfter,
                                fault.recoverySeconds.map { String(format: "%.0f s after the heal", $0) } ?? "not within the run"))
        }
        lines.append("")
        lines.append("invariants:")
        for invariant in summary.invariants {
            lines.append("  \(invariant.held ? "held  " : "BROKEN") \(invariant.name): \(invariant.checked) checked, \(invariant.broken) broken")
            for detail in invariant.details { lines.append("           \(detail)") }
        }
        if !summary.thresholds.isEmpty {
            lines.append("thresholds:")
            for threshold in summary.thresholds {
                lines.append(String(format: "  %@ %@ (actual %.3f%@)", threshold.passed ? "passed" : "CROSSED", threshold.threshold, threshold.actual, threshold.unit))
            }
        }
        lines.append("")
        lines.append(summary.passed ? "PASSED" : "FAILED")
        return lines.joined(separator: "\n")
    }

    static func json(_ summary: RunSummary) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return try encoder.encode(summary)
    }

    // MARK: HTML

    static let palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                          "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]

    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    struct Series {
        var name: String
        var color: String
        var points: [(Double, Double)]
    }

    /// An SVG line chart; `events` are drawn as vertical lines (kills and faults red, restarts and heals green).
    static func chart(_ title: String, yLabel: String, series: [Series], xMax: Double, events: [Chaos.Event] = [],
                      xLabel: String = "seconds", xTicks: [(Double, String)]? = nil, logY: Bool = false, bars: Bool = false) -> String {
        let width = 960.0, height = 280.0, left = 64.0, right = 16.0, top = 28.0, bottom = 40.0
        let plotWidth = width - left - right, plotHeight = height - top - bottom
        let values = series.flatMap { $0.points.map(\.1) }
        let rawMax = max(values.max() ?? 1, logY ? 1 : 0.001)
        let yMin = logY ? max(0.01, pow(10, floor(log10(max(values.filter { $0 > 0 }.min() ?? 0.1, 0.01))))) : 0
        let yMax = logY ? pow(10, ceil(log10(rawMax))) : niceCeiling(rawMax)
        func x(_ value: Double) -> Double { left + plotWidth * min(max(value / max(xMax, 0.001), 0), 1) }
        func y(_ value: Double) -> Double {
            if logY {
                let v = max(value, yMin)
                return top + plotHeight * (1 - (log10(v) - log10(yMin)) / max(log10(yMax) - log10(yMin), 0.001))
            }
            return top + plotHeight * (1 - min(value, yMax) / yMax)
        }
        var svg = "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 \(Int(width)) \(Int(height))' width='100%' role='img' aria-label='\(escape(title))'>"
        svg += "<text x='\(left)' y='18' class='title'>\(escape(title))</text>"
        svg += "<rect x='\(left)' y='\(top)' width='\(plotWidth)' height='\(plotHeight)' class='plot'/>"
        // Y grid
        let yTicks: [Double] = logY
            ? stride(from: log10(yMin), through: log10(yMax), by: 1).map { pow(10, $0) }
            : (0...4).map { yMax * Double($0) / 4 }
        for tick in yTicks {
            svg += "<line x1='\(left)' x2='\(left + plotWidth)' y1='\(y(tick))' y2='\(y(tick))' class='grid'/>"
            svg += "<text x='\(left - 6)' y='\(y(tick) + 4)' class='tick' text-anchor='end'>\(format(tick))</text>"
        }
        svg += "<text x='14' y='\(top + plotHeight / 2)' class='axis' transform='rotate(-90 14 \(top + plotHeight / 2))' text-anchor='middle'>\(escape(yLabel))</text>"
        // X ticks
        let ticks = xTicks ?? stride(from: 0.0, through: xMax, by: max(1, niceCeiling(xMax / 10))).map { ($0, format($0)) }
        for (value, label) in ticks {
            svg += "<line x1='\(x(value))' x2='\(x(value))' y1='\(top + plotHeight)' y2='\(top + plotHeight + 4)' class='axisline'/>"
            svg += "<text x='\(x(value))' y='\(top + plotHeight + 16)' class='tick' text-anchor='middle'>\(escape(label))</text>"
        }
        svg += "<text x='\(left + plotWidth / 2)' y='\(height - 4)' class='axis' text-anchor='middle'>\(escape(xLabel))</text>"
        // Chaos events
        for event in events {
            let kill = event.kind == "kill" || event.kind.hasPrefix("fault")
            svg += "<line x1='\(x(event.at))' x2='\(x(event.at))' y1='\(top)' y2='\(top + plotHeight)' class='\(kill ? "kill" : "restart")'><title>\(escape("\(event.kind) \(event.process) at \(format(event.at)) s"))</title></line>"
            if kill { svg += "<text x='\(x(event.at) + 3)' y='\(top + 10)' class='event'>✕ \(escape(event.process))</text>" }
        }
        for item in series {
            if bars {
                let barWidth = max(1, plotWidth / max(xMax, 1) - 1)
                for (px, py) in item.points where py > 0 {
                    svg += "<rect x='\(x(px))' y='\(y(py))' width='\(barWidth)' height='\(top + plotHeight - y(py))' fill='\(item.color)'><title>\(escape("\(item.name): \(format(py)) at \(format(px)) s"))</title></rect>"
                }
            } else if !item.points.isEmpty {
                let path = item.points.map { "\(String(format: "%.1f", x($0.0))),\(String(format: "%.1f", y($0.1)))" }.joined(separator: " ")
                svg += "<polyline points='\(path)' fill='none' stroke='\(item.color)' stroke-width='1.6'><title>\(escape(item.name))</title></polyline>"
            }
        }
        svg += "</svg>"
        var legend = "<div class='legend'>"
        for item in series { legend += "<span><i style='background:\(item.color)'></i>\(escape(item.name))</span>" }
        return svg + legend + "</div>"
    }

    static func niceCeiling(_ value: Double) -> Double {
        guard value > 0 else { return 1 }
        let magnitude = pow(10, floor(log10(value)))
        for step in [1.0, 2, 2.5, 5, 10] where step * magnitude >= value { return step * magnitude }
        return 10 * magnitude
    }

    static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e9 ? String(Int(value)) : value >= 10 ? String(format: "%.0f", value) : String(format: "%.2g", value)
    }

    /// One self-contained page: no scripts, no fonts, no external anything.
    static func html(_ summary: RunSummary) -> String {
        let routes = summary.routes.map(\.route)
        let color = Dictionary(uniqueKeysWithValues: routes.enumerated().map { ($0.element, palette[$0.offset % palette.count]) })
        let xMax = max(summary.seconds, 1)
        func series(_ value: (Recorder.SecondOfRoute) -> Double) -> [Series] {
            routes.map { route in
                Series(name: route, color: color[route]!, points: (summary.timeline[route] ?? []).map { (Double($0.second) + 0.5, value($0)) })
            }
        }
        var errorsPerSecond: [Int: Double] = [:]
        for (_, seconds) in summary.timeline { for second in seconds { errorsPerSecond[second.second, default: 0] += Double(second.errors) } }
        let nines: [(Double, String)] = [(0, "0%"), (1, "90%"), (2, "99%"), (3, "99.9%"), (4, "99.99%")]
        let distribution = summary.routes.map { route in
            Series(name: route.route, color: color[route.route]!, points: route.distribution.filter { $0[0] < 100 }.map {
                (min(4, -log10(max(1 - $0[0] / 100, 0.0001))), max($0[1], 0.01))
            })
        }
        var page = """
        <!doctype html><html lang="en"><head><meta charset="utf-8"><title>loadtest \(escape(summary.startedAt))</title>
        <style>
        body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1000px}
        h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:12.5px}
        td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
        .held{color:#1a7f37;font-weight:600}.broken{color:#c62828;font-weight:600}
        svg{background:#fff;margin-top:8px}.plot{fill:#fafafa;stroke:#ccc}.grid{stroke:#e4e4e4}.axisline{stroke:#999}
        .tick{font-size:10px;fill:#555}.axis{font-size:11px;fill:#333}.title{font-size:13px;font-weight:600;fill:#222}
        .kill{stroke:#c62828;stroke-dasharray:4 3;stroke-width:1.4}.restart{stroke:#2e7d32;stroke-dasharray:2 3;stroke-width:1}
        .event{font-size:9.5px;fill:#c62828}.legend{font-size:11.5px;margin:2px 0 8px 64px}.legend span{margin-right:14px;white-space:nowrap}
        .legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
        .verdict{font-size:18px;font-weight:700}
        </style></head><body>
        <h1>loadtest against \(escape(summary.target))</h1>
        <p class="verdict \(summary.passed ? "held" : "broken")">\(summary.passed ? "PASSED" : "FAILED")</p>
        <p>\(escape(summary.startedAt)) · \(escape(summary.model)) model · \(Int(summary.seconds)) s · seed \(summary.seed) ·
        \(summary.requests) requests (\(String(format: "%.1f", summary.requestsPerSecond)) req/s) · \(summary.errors) errors ·
        \(summary.sessions) sessions (\(summary.droppedSessions) dropped) · jobs \(summary.jobsAccepted) accepted, \(summary.jobsFinished) seen finished ·
        \(summary.chaos.filter { $0.kind == "kill" }.count) processes killed</p>
        <h2>Invariants</h2><table><tr><th>invariant</th><th>result</th><th>checked</th><th>broken</th></tr>
        """
        for invariant in summary.invariants {
            page += "<tr><td>\(escape(invariant.name))\(invariant.details.isEmpty ? "" : "<br><small>" + invariant.details.map(escape).joined(separator: "<br>") + "</small>")</td>"
            page += "<td class='\(invariant.held ? "held" : "broken")'>\(invariant.held ? "held" : "broken")</td><td>\(invariant.checked)</td><td>\(invariant.broken)</td></tr>"
        }
        page += "</table>"
        if !summary.thresholds.isEmpty {
            page += "<h2>Thresholds</h2><table><tr><th>threshold</th><th>actual</th><th>result</th></tr>"
            for threshold in summary.thresholds {
                page += "<tr><td>\(escape(threshold.threshold))</td><td>\(String(format: "%.3f", threshold.actual)) \(escape(threshold.unit))</td><td class='\(threshold.passed ? "held" : "broken")'>\(threshold.passed ? "passed" : "crossed")</td></tr>"
            }
            page += "</table>"
        }
        page += "<h2>Routes</h2><table><tr><th>route</th><th>req/s</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>errors</th><th>statuses</th></tr>"
        for route in summary.routes {
            let l = route.latency
            let statuses = route.statuses.sorted { $0.key < $1.key }.map { "\($0.key == "0" ? "none" : $0.key)×\($0.value.count)" }.joined(separator: " ")
            page += "<tr><td><i style='display:inline-block;width:9px;height:9px;background:\(color[route.route]!)'></i> \(escape(route.route))</td>"
            page += "<td>\(String(format: "%.1f", route.requestsPerSecond))</td><td>\(ms(l.p50Ms))</td><td>\(ms(l.p90Ms))</td><td>\(ms(l.p99Ms))</td><td>\(ms(l.p999Ms))</td><td>\(ms(l.maxMs))</td><td>\(route.errors)</td><td>\(escape(statuses))</td></tr>"
        }
        page += "</table>"
        page += "<h2>Over time</h2>"
        page += chart("Throughput by route", yLabel: "requests / s", series: series { Double($0.count) }, xMax: xMax, events: summary.chaos)
        page += chart("p50 latency by route", yLabel: "ms", series: series(\.p50Ms), xMax: xMax, events: summary.chaos, logY: true)
        page += chart("p99 latency by route", yLabel: "ms", series: series(\.p99Ms), xMax: xMax, events: summary.chaos, logY: true)
        page += chart("Errors (5xx and unanswered requests)", yLabel: "errors / s",
                      series: [Series(name: "errors", color: "#c62828", points: errorsPerSecond.sorted { $0.key < $1.key }.map { (Double($0.key), $0.value) })],
                      xMax: xMax, events: summary.chaos, bars: true)
        page += "<h2>Latency distribution</h2>"
        page += chart("Latency by percentile, per route", yLabel: "ms", series: distribution, xMax: 4, xLabel: "percentile",
                      xTicks: nines, logY: true)
        if !summary.problems.isEmpty {
            page += "<h2>Errors by problem type</h2><table><tr><th>status and problem</th><th>count</th></tr>"
            for (problem, count) in summary.problems.sorted(by: { $0.key < $1.key }) { page += "<tr><td>\(escape(problem))</td><td>\(count)</td></tr>" }
            page += "</table>"
        }
        if !summary.chaos.isEmpty {
            page += "<h2>Chaos events</h2><table><tr><th>at</th><th>event</th><th>process</th><th>pid</th><th>down for</th></tr>"
            for event in summary.chaos {
                page += "<tr><td>\(String(format: "%.1f s", event.at))</td><td>\(escape(event.kind))</td><td>\(escape(event.process))</td><td>\(event.pid)</td><td>\(event.downtime.map { String(format: "%.1f s", $0) } ?? "")</td></tr>"
            }
            page += "</table>"
        }
        return page + "</body></html>\n"
    }
}
