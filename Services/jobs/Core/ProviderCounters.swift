import Foundation

/// Sums a worker counter by provider over the metrics text the connected workers last sent (the
/// Prometheus text format: `name{provider="gemini",model="…"} 3`), for the operators' view of the
/// providers: rate-limit waits and refusals since each worker started.
public enum ProviderCounters {
    public static func sum(_ metric: String, in texts: [String]) -> [String: Int] {
        var totals: [String: Int] = [:]
        for text in texts {
            for line in text.split(separator: "\n") where line.hasPrefix(metric) {
                let rest = line.dropFirst(metric.count)
                guard rest.first == "{", let close = rest.firstIndex(of: "}"),
                      let value = Double(rest[rest.index(after: close)...].trimmingCharacters(in: .whitespaces)), value.isFinite, value >= 0,
                      let provider = label("provider", in: rest[rest.index(after: rest.startIndex)..<close])
                else { continue }
                totals[provider, default: 0] += Int(min(value, Double(Int.max / 2)))
            }
        }
        return totals
    }

    /// A label's value in `a="x",b="y"` (values without escaped quotes, as provider names are).
    static func label(_ name: String, in labels: Substring) -> String? {
        for pair in labels.split(separator: ",") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, parts[0].trimmingCharacters(in: .whitespaces) == name else { continue }
            let value = parts[1].trimmingCharacters(in: .whitespaces)
            guard value.count >= 2, value.hasPrefix("\""), value.hasSuffix("\"") else { return nil }
            return String(value.dropFirst().dropLast())
        }
        return nil
    }
}
