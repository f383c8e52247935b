import Foundation
import Logging

/// A worker's scratch folder, where a job's files live while it runs. By default each worker
/// process has its own, `photoedit-worker-<pid>` under the system's temporary folder, which it
/// holds by a lock on the `.lock` file inside and removes when it exits. A worker killed outright
/// (SIGKILL, a crash, the machine's OOM killer) cannot remove it, so each worker starting sweeps
/// the folders of that name whose worker is gone: the process that named it is not running here,
/// and nobody holds its lock (which also covers workers in other process namespaces that share
/// the temporary folder). A folder the operator names (`WORKER_SCRATCH_DIR`) is theirs: it is
/// neither swept nor removed. All of this is blocking file work, done as the process starts and
/// ends, before and after its services run.
public final class ScratchFolder: Sendable {
    /// The worker cannot start: its scratch folder cannot be claimed.
    public struct ScratchFolderError: Error, CustomStringConvertible {
        public var description: String
    }

    public let url: URL
    /// The open, locked `.lock` file of a folder of our own naming; -1 for the operator's folder.
    private let lock: Int32

    /// The default folders' names, before the pid.
    public static let prefix = "photoedit-worker-"

    /// Creates the folder at `path` (the operator's), or the default one (in `parent`, named for
    /// `pid`: this process's, but for tests), locked, after sweeping the default folders of
    /// workers that are gone.
    public static func claim(
        path: String?, parent: URL = FileManager.default.temporaryDirectory, pid: Int32 = ProcessInfo.processInfo.processIdentifier,
        logger: Logger
    ) throws -> ScratchFolder {
        if let path {
            let url = URL(fileURLWithPath: path)
            try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
            return ScratchFolder(url: url, lock: -1)
        }
        let url = parent.appendingPathComponent("\(prefix)\(pid)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        let lock = open(url.appendingPathComponent(".lock").path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0, flock(lock, LOCK_EX | LOCK_NB) == 0 else {
            let reason = String(cString: strerror(errno))
            if lock >= 0 { close(lock) }
            throw ScratchFolderError(description: "cannot lock the scratch folder \(url.path): \(reason)")
        }
        // A folder of this name already there was left by a process of this pid that is gone
        // (a container's worker restarted, pid 1 again): its jobs' files go.
        for name in (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? [] where name != ".lock" {
            try? FileManager.default.removeItem(at: url.appendingPathComponent(name))
        }
        let swept = sweep(in: url.deletingLastPathComponent(), except: url.lastPathComponent)
        if swept > 0 { logger.info("removed the scratch folders of workers that are gone", metadata: ["folders": "\(swept)"]) }
        return ScratchFolder(url: url, lock: lock)
    }

    private init(url: URL, lock: Int32) {
        self.url = url
        self.lock = lock
    }

    /// Removes the folder if it is one of our own naming (the worker is exiting).
    public func release() {
        guard lock >= 0 else { return }
        try? FileManager.default.removeItem(at: url)
        close(lock)
    }

    /// Removes, in `parent`, the default folders (but `own`) whose worker is gone; returns how many.
    static func sweep(in parent: URL, except own: String) -> Int {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: parent.path) else { return 0 }
        var removed = 0
        for name in names where name.hasPrefix(prefix) && name != own {
            guard let pid = Int32(name.dropFirst(prefix.count)), pid > 0 else { continue }
            // The process that named it still runs here (or a process with its number: then the
            // folder waits for a later sweep).
            if kill(pid, 0) == 0 || errno == EPERM { continue }
            let folder = parent.appendingPathComponent(name)
            let lock = open(folder.appendingPathComponent(".lock").path, O_RDWR | O_CLOEXEC)
            if lock >= 0 {
                defer { close(lock) }
                // Held: its worker runs in another process namespace sharing this folder.
                guard flock(lock, LOCK_EX | LOCK_NB) == 0 else { continue }
            }
            if (try? FileManager.default.removeItem(at: folder)) != nil { removed += 1 }
        }
        return removed
    }
}
