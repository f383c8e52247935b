import Foundation

/// A strict reader of the Prometheus text format (version 0.0.4), for tests: it refuses what a
/// Prometheus server would refuse, and more (a family split in two, a series twice, a histogram
/// whose buckets do not add up).
struct PrometheusExposition {
    struct Sample: Hashable {
        var name: String
        var labels: [String: String]
        var value: Double
    }

    struct Malformed: Error, CustomStringConvertible {
        var line: Int
        var reason: String
        var description: String { "line \(line): \(reason)" }
    }

    private(set) var samples: [Sample] = []
    private(set) var types: [String: String] = [:]

    init(_ text: String) throws {
        var seenFamilies: Set<String> = []
        var current: String?
        var series: Set<String> = []
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = String(raw), number = index + 1
            if line.isEmpty { continue }
            if line.hasPrefix("#") {
                let parts = line.split(separator: " ", maxSplits: 3).map(String.init)
                guard parts.count >= 3, parts[0] == "#" else { continue }  // a plain comment
                guard parts[1] == "HELP" || parts[1] == "TYPE" else { continue }
                let name = parts[2]
                guard Self.isMetricName(name) else { throw Malformed(line: number, reason: "bad metric name \(name)") }
                if current != name {
                    guard !seenFamilies.contains(name) else { throw Malformed(line: number, reason: "family \(name) appears twice") }
                    seenFamilies.insert(name)
                    current = name
                }
                if parts[1] == "TYPE" {
                    guard parts.count == 4, ["counter", "gauge", "histogram", "summary", "untyped"].contains(parts[3]) else {
                        throw Malformed(line: number, reason: "bad TYPE line")
                    }
                    guard types[name] == nil else { throw Malformed(line: number, reason: "second TYPE for \(name)") }
                    guard !samples.contains(where: { Self.family(of: $0.name, types: [name: parts[3]]) == name }) else {
                        throw Malformed(line: number, reason: "TYPE of \(name) after its samples")
                    }
                    types[name] = parts[3]
                }
                continue
            }
            let sample = try Self.parseSample(line, number: number)
            let family = Self.family(of: sample.name, types: types)
            if current != family {
                guard !seenFamilies.contains(family) else { throw Malformed(line: number, reason: "samples of \(family) are not together") }
                seenFamilies.insert(family)
                current = family
            }
            let key = sample.name + "{" + sample.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",") + "}"
            guard series.insert(key).inserted else { throw Malformed(line: number, reason: "series \(key) twice") }
            samples.append(sample)
        }
        try checkHistograms()
    }

    /// The value of the one sample named `name` whose labels include `labels`; nil if none.
    func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        samples.first { sample in sample.name == name && labels.allSatisfy { key, value in sample.labels[key] == value } }?.value
    }

    /// The sum of the samples named `name` whose labels include `labels`.
    func sum(_ name: String, _ labels: [String: String] = [:]) -> Double {
        samples.filter { sample in sample.name == name && labels.allSatisfy { key, value in sample.labels[key] == value } }.reduce(0) { $0 + $1.value }
    }

    private func checkHistograms() throws {
        for (family, type) in types where type == "histogram" {
            var buckets: [[String: String]: [(Double, Double)]] = [:]
            for sample in samples where sample.name == family + "_bucket" {
                guard let le = sample.labels["le"], let bound = le == "+Inf" ? Double.infinity : Double(le) else {
                    throw Malformed(line: 0, reason: "\(family) bucket without a usable le")
                }
                var labels = sample.labels
                labels["le"] = nil
                buckets[labels, default: []].append((bound, sample.value))
            }
            for (labels, series) in buckets {
                let sorted = series.sorted { $0.0 < $1.0 }
                guard sorted.last?.0 == .infinity else { throw Malformed(line: 0, reason: "\(family) \(labels) has no +Inf bucket") }
                for (lower, upper) in zip(sorted, sorted.dropFirst()) where upper.1 < lower.1 {
                    throw Malformed(line: 0, reason: "\(family) \(labels): buckets decrease")
                }
                let count = samples.first { $0.name == family + "_count" && $0.labels == labels }?.value
                guard count == sorted.last?.1 else { throw Malformed(line: 0, reason: "\(family) \(labels): +Inf bucket is not _count") }
            }
        }
    }

    private static func family(of name: String, types: [String: String]) -> String {
        for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
            let base = String(name.dropLast(suffix.count))
            if types[base] == "histogram" || types[base] == "summary" { return base }
        }
        return name
    }

    private static func parseSample(_ line: String, number: Int) throws -> Sample {
        var rest = Substring(line)
        let nameEnd = rest.firstIndex { $0 == "{" || $0 == " " } ?? rest.endIndex
        let name = String(rest[..<nameEnd])
        guard isMetricName(name) else { throw Malformed(line: number, reason: "bad metric name '\(name)'") }
        rest = rest[nameEnd...]
        var labels: [String: String] = [:]
        if rest.first == "{" {
            rest = rest.dropFirst()
            while rest.first != "}" {
                guard let equals = rest.firstIndex(of: "=") else { throw Malformed(line: number, reason: "label without =") }
                let label = String(rest[..<equals])
                guard isLabelName(label), labels[label] == nil else { throw Malformed(line: number, reason: "bad or repeated label '\(label)'") }
                rest = rest[rest.index(after: equals)...]
                guard rest.first == "\"" else { throw Malformed(line: number, reason: "label value not quoted") }
                rest = rest.dropFirst()
                var value = ""
                while true {
                    guard let character = rest.first else { throw Malformed(line: number, reason: "unterminated label value") }
                    rest = rest.dropFirst()
                    if character == "\"" { break }
                    if character == "\\" {
                        guard let escaped = rest.first, ["\\", "\"", "n"].contains(escaped) else { throw Malformed(line: number, reason: "bad escape") }
                        value.append(escaped == "n" ? "\n" : escaped)
                        rest = rest.dropFirst()
                    } else {
                        value.append(character)
                    }
                }
                labels[label] = value
                if rest.first == "," { rest = rest.dropFirst() } else if rest.first != "}" { throw Malformed(line: number, reason: "expected , or }") }
            }
            rest = rest.dropFirst()
        }
        guard rest.first == " " else { throw Malformed(line: number, reason: "no space before the value") }
        let fields = rest.dropFirst().split(separator: " ", omittingEmptySubsequences: false)
        guard (1...2).contains(fields.count), let value = Self.number(fields[0]) else { throw Malformed(line: number, reason: "bad value") }
        if fields.count == 2, Int64(fields[1]) == nil { throw Malformed(line: number, reason: "bad timestamp") }
        return Sample(name: name, labels: labels, value: value)
    }

    private static func number(_ text: Substring) -> Double? {
        switch text {
        case "+Inf": .infinity
        case "-Inf": -.infinity
        case "NaN": .nan
        default: text.wholeMatch(of: /-?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?/) != nil ? Double(text) : nil
        }
    }

    private static func isMetricName(_ name: String) -> Bool { name.wholeMatch(of: /[a-zA-Z_:][a-zA-Z0-9_:]*/) != nil }
    private static func isLabelName(_ name: String) -> Bool { name.wholeMatch(of: /[a-zA-Z_][a-zA-Z0-9_]*/) != nil && !name.hasPrefix("__") }
}
