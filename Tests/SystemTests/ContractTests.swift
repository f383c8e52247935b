import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@Suite("The contract", .serialized, .timeLimit(.minutes(5)))
struct ContractTests {
    static let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("openapi.yaml")

    @Test func theDocumentServedIsTheFile() async throws {
        let system = try await JobSystem(workers: 0)
        system.configuration.openAPIFile = Self.file.path
        let text = try String(contentsOf: Self.file, encoding: .utf8)
        try await system.gateway { client in
            let yaml = try await client.execute(uri: "/openapi.yaml", method: .get)
            #expect(yaml.status == .ok && yaml.headers[.contentType] == "application/yaml")
            #expect(String(buffer: yaml.body) == text)
            // The JSON form is the same document: every path of the file, with its operations
            let json = try await client.execute(uri: "/openapi.json", method: .get)
            let document = try #require(try JSONSerialization.jsonObject(with: Data(buffer: json.body)) as? [String: Any])
            #expect(document["openapi"] as? String == "3.1.0")
            let paths = try #require(document["paths"] as? [String: Any])
            let filePaths = text.split(separator: "\n").filter { $0.hasPrefix("  /") }.map { String($0.dropFirst(2).dropLast()) }
            #expect(Set(paths.keys) == Set(filePaths) && paths.count >= 28)
        }
        await system.stop()
    }
}

/// The committed client is what the generator makes of the document. `make generate` writes it and
/// then `Clients/openapi-generated.sha256` (`sha256sum` of the document, the generator's
/// settings and every generated file). Checking those sums needs no generator: building one
/// took make test 49 s, and the first stack's build after it 54 s more (its plugin tools). Where
/// the generator was built (`swift build --product swift-openapi-generator`), the second test
/// also runs it and compares its output with the committed files byte for byte.
@Suite("The generated client", .timeLimit(.minutes(5)))
struct GeneratedClientTests {
    static let root = ContractTests.file.deletingLastPathComponent()
    static let sums = "Clients/openapi-generated.sha256"

    @Test func theDocumentAndTheCommittedCodeAreThoseTheLastGenerationSummed() throws {
        let text = try String(contentsOf: Self.root.appendingPathComponent(Self.sums), encoding: .utf8)
        var summed: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ", maxSplits: 1)
            try #require(parts.count == 2 && parts[0].count == 64, "\(Self.sums): a line that is not `SUM  PATH`: \(line)")
            summed[String(parts[1].drop { $0 == " " || $0 == "*" })] = String(parts[0])
        }
        let generated = "Clients/PhotoEditKit/Generated"
        let files = try FileManager.default.contentsOfDirectory(atPath: Self.root.appendingPathComponent(generated).path)
            .filter { $0.hasSuffix(".swift") }.map { "\(generated)/\($0)" }
        let inputs = ["openapi.yaml", "Clients/openapi-generator-config.yaml"]
        #expect(Set(summed.keys) == Set(inputs + files), "\(Self.sums) names other files than those generated: run make generate")
        for path in inputs + files {
            let data = try Data(contentsOf: Self.root.appendingPathComponent(path))
            let sum = SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
            #expect(summed[path] == sum, "\(path) changed since the client was generated: run make generate")
        }
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: GeneratedClientTests.generator.path)))
    func theCommittedCodeIsWhatTheGeneratorMakesOfTheDocument() async throws {
        let root = Self.root
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("generated-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: output) }
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        let generated = try await ServiceProcess.runToEnd(Self.generator.path, [
            "generate", root.appendingPathComponent("openapi.yaml").path,
            "--config", root.appendingPathComponent("Clients/openapi-generator-config.yaml").path,
            "--output-directory", output.path,
        ])
        #expect(generated.status == 0, "\(generated.output)")
        let committed = root.appendingPathComponent("Clients/PhotoEditKit/Generated")
        let names = try FileManager.default.contentsOfDirectory(atPath: output.path).sorted()
        #expect(names == (try FileManager.default.contentsOfDirectory(atPath: committed.path).sorted()))
        for name in names {
            let fresh = try Data(contentsOf: output.appendingPathComponent(name))
            let kept = try Data(contentsOf: committed.appendingPathComponent(name))
            #expect(fresh == kept, "Clients/PhotoEditKit/Generated/\(name) is stale: run make generate")
        }
    }

    static var generator: URL { ServiceProcess.binaryDirectory.appendingPathComponent("swift-openapi-generator") }
}
