import Foundation
import Messages

/// Merges Prometheus text expositions (version 0.0.4) of several processes into one, adding each
/// section's labels to its samples. A metric family that several processes expose appears once,
/// with one `# HELP` and `# TYPE` line and the samples of all of them together, as the format
/// requires; a family without HELP text takes its text from `MetricsCatalogue`. A section that a process sent malformed loses only the lines that are not samples.
public enum PrometheusText {
    struct Family {
        var help: String?
        var type: String?
        var samples: [String] = []
    }

    /// One exposition of all `sections`, each sample labelled with its section's labels first.
    public static func merge(_ sections: [MetricsSection]) -> String {
        var order: [String] = []
        var families: [String: Family] = [:]
        for section in sections {
            let extra = section.labels.sorted { $0.key < $1.key }
                .filter { isName($0.key) }
                .map { "\($0.key)=\"\(escape($0.value))\"" }
                .joined(separator: ",")
            var current: String?
            for line in section.text.split(separator: "\n", omittingEmptySubsequences: true) {
                if line.hasPrefix("#") {
                    let parts = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: true)
                    guard parts.count >= 3, parts[1] == "HELP" || parts[1] == "TYPE" else { continue }
                    let name = String(parts[2])
                    guard isName(name) else { continue }
                    if families[name] == nil { families[name] = Family(); order.append(name) }
                    let rest = parts.count > 3 ? String(parts[3]) : ""
                    if parts[1] == "TYPE" {
                        if families[name]?.type == nil { families[name]?.type = rest }
                    } else if families[name]?.help == nil {
                        families[name]?.help = rest
                    }
                    current = name
                    continue
                }
                guard let (name, labelled) = relabel(line, extra: extra) else { continue }
                let family = current.flatMap { belongs(name, to: $0, type: families[$0]?.type) ? $0 : nil } ?? name
                if families[family] == nil { families[family] = Family(); order.append(family) }
                families[family]?.samples.append(labelled)
                current = family
            }
        }
        var text = ""
        for name in order {
            guard let family = families[name], !family.samples.isEmpty else { continue }
            if let help = family.help.flatMap({ $0.isEmpty ? nil : $0 }) ?? MetricsCatalogue.help[name] { text += "# HELP \(name) \(help)\n" }
            if let type = family.type { text += "# TYPE \(name) \(type)\n" }
            for sample in family.samples { text += sample + "\n" }
        }
        return text
    }

    /// Whether a sample named `sample` is part of family `family` of `type`.
    static func belongs(_ sample: String, to family: String, type: String?) -> Bool {
        if sample == family { return true }
        guard type == "histogram" || type == "summary" else { return false }
        return ["_bucket", "_sum", "_count"].contains { sample == family + $0 }
    }

    /// The sample's metric name and the line with `extra` labels first; nil if it is not a sample.
    static func relabel(_ line: Substring, extra: String) -> (String, String)? {
        guard let end = line.firstIndex(where: { $0 == "{" || $0 == " " }) else { return nil }
        let name = String(line[..<end])
        guard isName(name), hasValue(line[end...]) else { return nil }
        let rest = line[end...]
        if extra.isEmpty { return (name, String(line)) }
        if rest.hasPrefix("{}") {
            return (name, "\(name){\(extra)}\(rest.dropFirst(2))")
        } else if rest.hasPrefix("{") {
            return (name, "\(name){\(extra),\(rest.dropFirst())")
        } else {
            return (name, "\(name){\(extra)}\(rest)")
        }
    }

    /// Whether `rest` (after the name) is optional `{labels}` then ` value` and an optional
    /// timestamp.
    static func hasValue(_ rest: Substring) -> Bool {
        var tail = rest
        if tail.first == "{" {
            var quoted = false, escaped = false
            var close: Substring.Index?
            for index in tail.indices {
                let character = tail[index]
                if escaped { escaped = false; continue }
                if character == "\\" { escaped = quoted; continue }
                if character == "\"" { quoted.toggle(); continue }
                if character == "}" && !quoted { close = index; break }
            }
            guard let close else { return false }
            tail = tail[tail.index(after: close)...]
        }
        let fields = tail.split(separator: " ", omittingEmptySubsequences: true)
        guard tail.first == " ", (1...2).contains(fields.count) else { return false }
        let value = fields[0]
        guard ["+Inf", "-Inf", "NaN"].contains(value) || Double(value) != nil else { return false }
        return fields.count == 1 || Int64(fields[1]) != nil
    }

    static func isName(_ name: String) -> Bool {
        guard let first = name.utf8.first, !name.isEmpty else { return false }
        let isStart = (first >= 65 && first <= 90) || (first >= 97 && first <= 122) || first == 95 || first == 58
        return isStart && name.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 90) || ($0 >= 97 && $0 <= 122) || $0 == 95 || $0 == 58 }
    }

    static func escape(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"").replacingOccurrences(of: "\n", with: "\\n")
    }
}
