import Foundation
import Logging
import Testing
import WorkerKit

@Suite("Worker scratch folders", .timeLimit(.minutes(5)))
struct WorkerScratchTests {
    /// A process id that no process has now: a child's, once it has exited.
    func deadPid() throws -> Int32 {
        let (status, output, pid) = runQuickCommand(["/bin/true"])
        guard status == 0 else { throw ToolFailed(description: "/bin/true failed: \(output)") }
        return pid
    }

    @Test func aStartingWorkerRemovesTheFoldersOfWorkersThatAreGoneAndItsOwnWhenItStops() async throws {
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("scratch-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: temporary) }
        func folder(_ name: String, lock: Bool = true) throws -> URL {
            let url = temporary.appendingPathComponent(name)
            try FileManager.default.createDirectory(at: url.appendingPathComponent("job-1-abcd"), withIntermediateDirectories: true)
            try Data("half an image".utf8).write(to: url.appendingPathComponent("job-1-abcd/input.jpg"))
            if lock { try Data().write(to: url.appendingPathComponent(".lock")) }
            return url
        }
        // Given the folders of a worker killed outright (its process gone, its lock free), of one
        // from before the lock files (no lock), of a worker running here (this process), of one
        // in another process namespace sharing the folder (its pid unknown here, its lock held),
        // and a folder of something else
        let killed = try folder("photoedit-worker-\(try deadPid())")
        let older = try folder("photoedit-worker-\(try deadPid())", lock: false)
        let running = try folder("photoedit-worker-\(getpid())")
        let elsewhere = try folder("photoedit-worker-\(try deadPid())")
        let held = open(elsewhere.appendingPathComponent(".lock").path, O_RDWR)
        #expect(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0)
        defer { close(held) }
        let unrelated = try folder("photoedit-gateway-1")
        // When a worker starts with its default scratch folder there (no jobs service to reach)
        let worker = try ServiceProcess("worker", environment: [
            "TMPDIR": temporary.path, "JOBS_WORKER_ENDPOINT": "tcp://127.0.0.1:\(freePort())", "WORKER_HEARTBEAT_MS": "100",
        ])
        let own = temporary.appendingPathComponent("photoedit-worker-\(worker.pid)")
        func exists(_ url: URL) -> Bool { FileManager.default.fileExists(atPath: url.path) }
        // Then the folders of the workers that are gone are removed, the others kept
        // (and says so: the line comes after the removals, so it is waited for too)
        try await waitUntil {
            !exists(killed) && !exists(older) && exists(own.appendingPathComponent(".lock"))
                && worker.output.contains("removed the scratch folders of workers that are gone")
        }
        #expect(exists(running) && exists(elsewhere) && exists(unrelated))
        // And when it stops, its own folder goes with it
        worker.signal(SIGTERM)
        #expect(try await worker.waitForExit(within: .seconds(60)) == 0)
        #expect(!exists(own))
        #expect(exists(running) && exists(elsewhere))
    }

    @Test func aWorkerFindingAFolderOfItsOwnNameLeftBehindEmptiesIt() throws {
        // Given the folder a worker of the same pid left when it was killed (a container's worker
        // restarted as pid 1 again), with a job's half-written files in it
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("scratch-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: temporary) }
        let pid = try deadPid()
        let left = temporary.appendingPathComponent("photoedit-worker-\(pid)/job-1-abcd")
        try FileManager.default.createDirectory(at: left, withIntermediateDirectories: true)
        try Data("half an image".utf8).write(to: left.appendingPathComponent("input.jpg"))
        // When a worker of that pid claims it
        let scratch = try ScratchFolder.claim(path: nil, parent: temporary, pid: pid, logger: Logger(label: "test"))
        // Then it is its folder, locked, with nothing of the last worker's jobs in it
        #expect(scratch.url.lastPathComponent == "photoedit-worker-\(pid)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.url.path) == [".lock"])
        scratch.release()
        #expect(!FileManager.default.fileExists(atPath: scratch.url.path))
    }

    @Test func aFolderTheOperatorNamesIsNeitherSweptNorRemoved() async throws {
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("scratch-\(UUID().uuidString)")
        let named = temporary.appendingPathComponent("worker-scratch")
        let gone = temporary.appendingPathComponent("photoedit-worker-\(try deadPid())")
        try FileManager.default.createDirectory(at: gone, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: temporary) }
        // Given a worker whose scratch folder is named (WORKER_SCRATCH_DIR)
        let worker = try ServiceProcess("worker", environment: [
            "TMPDIR": temporary.path, "WORKER_SCRATCH_DIR": named.path,
            "JOBS_WORKER_ENDPOINT": "tcp://127.0.0.1:\(freePort())", "WORKER_HEARTBEAT_MS": "100",
        ])
        try await waitUntil { FileManager.default.fileExists(atPath: named.path) && worker.output.contains("ready sent") }
        // When it stops, then its folder stays, and nothing beside it was swept
        worker.signal(SIGTERM)
        #expect(try await worker.waitForExit(within: .seconds(60)) == 0)
        #expect(FileManager.default.fileExists(atPath: named.path))
        #expect(FileManager.default.fileExists(atPath: gone.path))
    }
}
