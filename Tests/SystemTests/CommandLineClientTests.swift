import Foundation
import Testing

/// `photoedit` as a user runs it, against the real stack with the gateway as a process.
@Suite("photoedit", .serialized, .timeLimit(.minutes(5)))
struct CommandLineClientTests {
    /// Runs `photoedit` with `arguments`; its exit status and what it printed.
    static func photoedit(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        try await ServiceProcess.runToEnd(ServiceProcess.binaryDirectory.appendingPathComponent("photoedit").path, arguments, within: .seconds(120))
    }

    @Test func editWaitSavesTheResultBesideThePhoto() async throws {
        let system = try await JobSystem(workers: 1)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("photoedit-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let photo = folder.appendingPathComponent("photo.jpg")
        try FileManager.default.copyItem(at: JobSystem.fixture, to: photo)
        let who = ["--gateway", "http://127.0.0.1:\(port)", "--device-id", UUID().uuidString]
        // edit --wait: the result and thumbnail land beside the photo
        let edit = try await Self.photoedit(["edit", photo.path, "--effect", "blur", "--param", "sigma=3", "--wait"] + who)
        #expect(edit.status == 0, "\(edit.output)")
        let result = folder.appendingPathComponent("photo.blur.jpg"), thumbnail = folder.appendingPathComponent("photo.blur.thumb.jpg")
        #expect(FileManager.default.fileExists(atPath: result.path) && FileManager.default.fileExists(atPath: thumbnail.path), "\(edit.output)")
        #expect(try JobSystem.dimensions(of: Data(contentsOf: thumbnail)) == (200, 200))
        // me and history show it
        let me = try await Self.photoedit(["me"] + who)
        #expect(me.status == 0 && me.output.contains("19 Free Edits Left"), "\(me.output)")
        let history = try await Self.photoedit(["history", "--by-month"] + who)
        #expect(history.status == 0 && history.output.contains("completed") && history.output.contains("Soft Focus"), "\(history.output)")
        // A bad parameter is a usage error; an unknown id is a one-line refusal
        #expect(try await Self.photoedit(["edit", photo.path, "--param", "sigma"] + who).status == 64)
        let missing = try await Self.photoedit(["delete", "no-such-job"] + who)
        #expect(missing.status == 1 && missing.output.split(separator: "\n").count == 1)
        await gateway.stop()
        // With the gateway gone: the network exit code
        #expect(try await Self.photoedit(["me"] + who).status == 69)
        await system.stop()
    }
}
