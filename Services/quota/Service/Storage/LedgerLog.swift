#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Messages
import Synchronization

/// The quota ledger's append-only log on disk: a folder of segment files, each named by the
/// sequence number of its first change (`00000000000000000001.log`). The ledger's thread appends
/// each batch's frames with one `write` and makes them durable with one `fdatasync` before anyone
/// is answered; a segment past `segmentBytes` is closed and the next one begun. Once the
/// checkpointer has written every change of a closed segment into the tables, the segment is
/// deleted (`removeApplied`).
final class LedgerLog: Sendable {
    let directory: String
    private let segmentBytes: Int
    /// The segment being appended to; touched by the ledger's thread only (and `removeApplied`
    /// reads the list of segments under the same lock).
    private let state: Mutex<State>

    private struct State {
        var descriptor: Int32
        var size: Int
        /// First sequence number of every segment on disk, oldest first; the last is the open one.
        var segments: [UInt64]
    }

    /// A new segment starting at `nextSeq` in `directory` (made if missing). Segments already
    /// there must have been replayed first (`QuotaDatabase.open` does, then removes them).
    init(directory: String, nextSeq: UInt64, segmentBytes: Int = 64 << 20) throws {
        self.directory = directory
        self.segmentBytes = segmentBytes
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let descriptor = try Self.create(directory: directory, firstSeq: nextSeq)
        state = Mutex(State(descriptor: descriptor, size: 0, segments: [nextSeq]))
    }

    deinit {
        state.withLock { _ = close($0.descriptor) }
    }

    /// Writes `bytes` at the end of the open segment. On failure the segment is cut back to where
    /// it was, so a later append does not follow a torn frame.
    func append(_ bytes: [UInt8]) throws(BusError) {
        try state.withLock { (state: inout State) throws(BusError) in
            var written = 0
            let failure: Int32? = bytes.withUnsafeBytes { buffer in
                while written < buffer.count {
                    let result = write(state.descriptor, buffer.baseAddress! + written, buffer.count - written)
                    if result < 0 {
                        if errno == EINTR { continue }
                        return errno
                    }
                    written += result
                }
                return nil
            }
            if let failure {
                if ftruncate(state.descriptor, off_t(state.size)) != 0 || lseek(state.descriptor, off_t(state.size), SEEK_SET) < 0 {
                    throw BusError(.storageUnavailable, "the quota ledger could not be cut back after a failed write (\(Self.describe(errno)))")
                }
                throw Self.error(failure, doing: "written")
            }
            state.size += written
        }
    }

    /// Makes everything appended so far durable.
    func sync() throws(BusError) {
        let descriptor = state.withLock { $0.descriptor }
        if fdatasync(descriptor) != 0 { throw Self.error(errno, doing: "synced") }
    }

    /// Begins a new segment at `nextSeq` when the open one is past its size (after a sync, so the
    /// closed segment is complete).
    func rollIfFull(nextSeq: UInt64) throws(BusError) {
        try state.withLock { (state: inout State) throws(BusError) in
            guard state.size >= segmentBytes else { return }
            let descriptor = try Self.create(directory: directory, firstSeq: nextSeq)
            _ = close(state.descriptor)
            state = State(descriptor: descriptor, size: 0, segments: state.segments + [nextSeq])
        }
    }

    /// Deletes the closed segments whose every change is at or below `appliedSeq`.
    func removeApplied(through appliedSeq: UInt64) {
        let removable = state.withLock { state -> [UInt64] in
            var removable: [UInt64] = []
            // A segment ends just before the next one begins; the open one is never removed.
            while state.segments.count > 1, state.segments[1] - 1 <= appliedSeq {
                removable.append(state.segments.removeFirst())
            }
            return removable
        }
        for first in removable { unlink(Self.path(directory, first)) }
    }

    /// The open segment's size, and the number of segments on disk (for tests).
    var shape: (size: Int, segments: Int) { state.withLock { ($0.size, $0.segments.count) } }

    // MARK: Reading back

    /// Every change in the segments of `directory`, oldest first, stopping at the first damaged
    /// or cut-short frame (the write a crash interrupted: nobody heard of it).
    static func readAll(directory: String) throws -> (changes: [LedgerChange], files: [String], torn: Bool) {
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
            .filter { $0.hasSuffix(".log") && UInt64($0.dropLast(4)) != nil }
            .sorted { UInt64($0.dropLast(4))! < UInt64($1.dropLast(4))! }
        var changes: [LedgerChange] = []
        var torn = false
        for name in names {
            let data = try Data(contentsOf: URL(fileURLWithPath: directory + "/" + name))
            let (read, valid) = data.withUnsafeBytes { LedgerFrame.read($0) }
            changes += read
            if valid < data.count {
                torn = true
                break
            }
        }
        return (changes, names.map { directory + "/" + $0 }, torn)
    }

    // MARK: Files

    private static func path(_ directory: String, _ firstSeq: UInt64) -> String {
        let digits = String(firstSeq)
        return directory + "/" + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".log"
    }

    /// Creates a segment and makes its name durable (the folder synced).
    private static func create(directory: String, firstSeq: UInt64) throws(BusError) -> Int32 {
        let descriptor = open(path(directory, firstSeq), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw error(errno, doing: "created") }
        try syncDirectory(directory)
        return descriptor
    }

    static func syncDirectory(_ directory: String) throws(BusError) {
        let folder = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { throw error(errno, doing: "opened") }
        defer { _ = close(folder) }
        if fsync(folder) != 0 { throw error(errno, doing: "synced") }
    }

    private static func error(_ code: Int32, doing action: String) -> BusError {
        if code == ENOSPC || code == EDQUOT { return BusError(.storageFull, "the service's disk is full") }
        return BusError(.storageUnavailable, "the quota ledger could not be \(action) (\(describe(code)))")
    }

    private static func describe(_ code: Int32) -> String { String(cString: strerror(code)) }
}
