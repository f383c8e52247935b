import ArgumentParser
import Foundation

/// A length of time given on the command line as k6, vegeta and wrk take it: a number with a
/// unit (`30s`, `2m`, `1h`, `500ms`, `1m30s`, `1.5m`), or a bare number of seconds (`30`).
struct DurationArgument: ExpressibleByArgument, Sendable, Equatable, CustomStringConvertible {
    /// The length in seconds.
    let seconds: Double

    init(seconds: Double) { self.seconds = seconds }

    init?(argument: String) {
        let text = argument.trimmingCharacters(in: .whitespaces).lowercased()
        guard !text.isEmpty else { return nil }
        if let plain = Double(text) {
            guard plain.isFinite, plain >= 0 else { return nil }
            seconds = plain
            return
        }
        // Go's `time.ParseDuration` shape, which k6 and vegeta use: parts of number and unit.
        var total = 0.0
        var rest = Substring(text)
        while !rest.isEmpty {
            let number = rest.prefix { $0.isNumber || $0 == "." }
            rest = rest.dropFirst(number.count)
            let unit = rest.prefix { $0.isLetter }
            rest = rest.dropFirst(unit.count)
            guard let value = Double(number), value.isFinite, let scale = Self.units[String(unit)] else { return nil }
            total += value * scale
        }
        seconds = total
    }

    private static let units: [String: Double] = ["ms": 0.001, "s": 1, "m": 60, "h": 3600]

    var description: String {
        seconds == seconds.rounded() ? "\(Int(seconds))s" : "\(seconds)s"
    }

    static var defaultCompletionKind: CompletionKind { .default }
}
