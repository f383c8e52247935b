import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

/// A small file system of its own for the services' data, filled up in the test.
struct SmallFileSystem {
    let mountPoint: URL

    /// Mounts a tmpfs of `megabytes`; nil where this process may not mount (not root, no
    /// CAP_SYS_ADMIN, a container without it).
    static func mount(megabytes: Int) -> SmallFileSystem? {
        let point = FileManager.default.temporaryDirectory.appendingPathComponent("small-fs-\(UUID().uuidString)")
        guard (try? FileManager.default.createDirectory(at: point, withIntermediateDirectories: true)) != nil else { return nil }
        guard run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(megabytes)m", "tmpfs", point.path]) == 0 else {
            try? FileManager.default.removeItem(at: point)
            return nil
        }
        return SmallFileSystem(mountPoint: point)
    }

    /// Whether a tmpfs can be mounted here at all.
    static let available: Bool = {
        guard let probe = mount(megabytes: 1) else { return false }
        probe.unmount()
        return true
    }()

    func unmount() {
        _ = Self.run("/bin/umount", ["-l", mountPoint.path])
        try? FileManager.default.removeItem(at: mountPoint)
    }

    /// Fills the file system with one file, 1 MiB at a time, until the disk is full.
    func fill() -> URL {
        let filler = mountPoint.appendingPathComponent("filler")
        _ = FileManager.default.createFile(atPath: filler.path, contents: nil)
        guard let handle = try? FileHandle(forWritingTo: filler) else { return filler }
        let block = Data(repeating: 0xAB, count: 1 << 20)
        while (try? handle.write(contentsOf: block)) != nil {}
        let small = Data(repeating: 0xAB, count: 4096)
        while (try? handle.write(contentsOf: small)) != nil {}
        try? handle.close()
        return filler
    }

    static func run(_ tool: String, _ arguments: [String]) -> Int32 {
        runQuickCommand([tool] + arguments).status
    }

}

@Suite("A full disk", .serialized, .timeLimit(.minutes(5)))
struct DiskFullTests {
    @Test(.enabled(if: SmallFileSystem.available, "needs to mount a tmpfs (root or CAP_SYS_ADMIN); skipped here"))
    func aFullDiskAnswers507AndEveryAdmittedJobCompletesOnceFreed() async throws {
        let disk = try #require(SmallFileSystem.mount(megabytes: 48))
        defer { disk.unmount() }
        let system = try await JobSystem(workers: 1, dataDirectory: disk.mountPoint.appendingPathComponent("data"))
        let user = JobSystem.guest(UUID())
        let userId = "device:\(user[.deviceId]!.lowercased())"
        try await system.gateway { client in
            // Given a working system with some images uploaded and one job done
            var keys: [String] = []
            for _ in 0..<6 { keys.append(try await JobSystem.upload(client, as: user)) }
            let warm = JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: keys[0], effect: "copy"))
            var admitted = [try #require(warm["jobId"] as? String)]
            #expect(try await JobSystem.waitForStatus(client, as: user, jobId: admitted[0])["status"] as? String == "completed")

            // And two jobs admitted while no worker runs
            await system.workers[0].stop()
            for key in keys.suffix(2) {
                let queued = JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy"))
                admitted.append(try #require(queued["jobId"] as? String))
            }

            // When the disk fills up, and a worker comes to run them
            let filler = disk.fill()
            let worker = try system.startWorker()
            // Then uploads answer 507 (or 503) as problems naming the cause, never 500
            for _ in 0..<3 {
                let presign = JobSystem.json(try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                                      body: ByteBuffer(string: #"{"filename": "a.jpg", "contentType": "image/jpeg"}"#)))
                let path = JobSystem.path(try #require(presign["uploadUrl"] as? String))
                let put = try await client.execute(uri: path, method: .put, headers: [.contentType: "image/jpeg"],
                                                   body: ByteBuffer(bytes: try Data(contentsOf: JobSystem.fixture)))
                #expect(put.status.code == 507 || put.status.code == 503, "upload answered \(put.status)")
                #expect(put.headers[.contentType] == "application/problem+json")
                let code = JobSystem.json(put)["code"] as? String
                #expect(code == "storage_full" || code == "storage_unavailable", "code \(code ?? "none")")
                #expect(put.headers[.retryAfter] != nil)
            }
            // And job creation either admits (the job must then finish) or answers 507/503, never 500
            var answers: [Int] = []
            for key in keys.dropFirst().prefix(3) {
                let create = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy")
                answers.append(create.status.code)
                #expect([202, 503, 507].contains(create.status.code), "create answered \(create.status): \(JobSystem.json(create))")
                if create.status == .accepted { admitted.append(try JobSystem.jobId(of: create)) }
                else { #expect(create.headers[.contentType] == "application/problem+json") }
            }

            // And the jobs do not move while the disk is full
            try await waitUntil(within: .seconds(20)) {
                let jobs = system.services.processes[.jobs]!.output
                return worker.output.contains("waiting for space") || jobs.contains("cannot start jobs yet") || jobs.contains("cannot requeue jobs yet")
            }
            #expect(!system.services.processes[.jobs]!.output.contains("handler failed"))

            // When space is freed
            try FileManager.default.removeItem(at: filler)
            // Then every admitted job completes and every charge settles: committed for each
            // completed job, none left reserved
            for jobId in admitted {
                let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId, within: .seconds(90))
                #expect(status["status"] as? String == "completed", "job \(jobId) is \(status["status"] ?? "?")")
            }
            try await waitUntil(within: .seconds(30)) {
                let charges = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).charges
                return !charges.contains { $0.state == .reserved }
            }
            let charges = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).charges
            #expect(Set(charges.filter { $0.state == .committed }.map(\.jobId)) == Set(admitted))
            // And uploads work again
            _ = try await JobSystem.upload(client, as: user)
            print("disk full: creates answered \(answers); \(admitted.count) admitted jobs all completed after space was freed")
        }
        await system.stop()
    }
}
