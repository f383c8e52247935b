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

@Suite("The generated client", .timeLimit(.minutes(5)))
struct GeneratedClientTests {
    @Test func theCommittedCodeIsWhatTheGeneratorMakesOfTheDocument() async throws {
        let root = ContractTests.file.deletingLastPathComponent()
        let generator = ServiceProcess.binaryDirectory.appendingPathComponent("swift-openapi-generator")
        try #require(FileManager.default.isExecutableFile(atPath: generator.path),
                     "build the generator first: swift build --product swift-openapi-generator (make test does)")
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("generated-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: output) }
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        let generated = try await ServiceProcess.runToEnd(generator.path, [
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
}
