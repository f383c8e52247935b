import Foundation
import Observation

/// One entry of a local history: its own id and time, around any `Codable` payload (the design
/// in `../shared/seeds/002_5e134dcf7859e662.txt`). Stored as one JSON line:
/// `{"id":"...","timestamp":1737590400.0,"data":{...}}`.
public struct HistoryEntry<T: Codable & Sendable>: Codable, Identifiable, Sendable {
    public let id: UUID
    public let timestamp: Date
    public let data: T

    public init(data: T, timestamp: Date = Date()) {
        self.id = UUID()
        self.timestamp = timestamp
        self.data = data
    }

    enum CodingKeys: String, CodingKey { case id, timestamp, data }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(UUID.self, forKey: .id)
        timestamp = Date(timeIntervalSince1970: try container.decode(Double.self, forKey: .timestamp))
        data = try container.decode(T.self, forKey: .data)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(timestamp.timeIntervalSince1970, forKey: .timestamp)
        try container.encode(data, forKey: .data)
    }
}

/// The disk side of a `ChronologicalHistoryManager`: a stateless actor with exactly three
/// commands. Each reports whether it worked (a failed write is the manager's to repair).
public protocol HistoryDiskIO<Entry>: Actor {
    associatedtype Entry: Codable & Sendable
    /// Command 1: the whole file, oldest first; nil if it cannot be read (a missing file is empty).
    func read() async -> [HistoryEntry<Entry>]?
    /// Command 2: one entry at the end of the file, as a JSON line.
    func append(_ entry: HistoryEntry<Entry>) async -> Bool
    /// Command 3: the whole file replaced by these entries, as JSON lines.
    func rewrite(_ entries: [HistoryEntry<Entry>]) async -> Bool
}

/// The JSON-lines file behind a history. Stateless: the file's URL is all it holds.
public actor DiskIOActor<Entry: Codable & Sendable>: HistoryDiskIO {
    let fileURL: URL

    public init(fileURL: URL) { self.fileURL = fileURL }

    public func read() -> [HistoryEntry<Entry>]? {
        guard FileManager.default.fileExists(atPath: fileURL.path) else { return [] }
        guard let data = try? Data(contentsOf: fileURL) else {
            HistoryLog.failure("cannot read \(fileURL.path)")
            return nil
        }
        let decoder = JSONDecoder()
        // A line that does not decode (cut short by a crash, say) is skipped, not fatal.
        return data.split(separator: UInt8(ascii: "\n")).compactMap { try? decoder.decode(HistoryEntry<Entry>.self, from: Data($0)) }
    }

    public func append(_ entry: HistoryEntry<Entry>) -> Bool {
        do {
            let line = try Self.line(entry)
            if !FileManager.default.fileExists(atPath: fileURL.path) {
                try line.write(to: fileURL, options: .atomic)
                return true
            }
            let handle = try FileHandle(forWritingTo: fileURL)
            defer { try? handle.close() }
            try handle.seekToEnd()
            try handle.write(contentsOf: line)
            return true
        } catch {
            HistoryLog.failure("cannot append to \(fileURL.path): \(error)")
            return false
        }
    }

    public func rewrite(_ entries: [HistoryEntry<Entry>]) -> Bool {
        do {
            var data = Data()
            for entry in entries { data.append(try Self.line(entry)) }
            try data.write(to: fileURL, options: .atomic)
            return true
        } catch {
            HistoryLog.failure("cannot rewrite \(fileURL.path): \(error)")
            return false
        }
    }

    static func line(_ entry: HistoryEntry<Entry>) throws -> Data {
        var data = try JSONEncoder().encode(entry)
        data.append(UInt8(ascii: "\n"))
        return data
    }
}

/// Where disk failures of a history go: they are logged, never thrown (history is not crucial).
enum HistoryLog {
    static func failure(_ message: String) {
        FileHandle.standardError.write(Data("ChronologicalHistoryManager: \(message)\n".utf8))
    }
}

/// A generic, file-backed local history, exactly as `../shared/seeds/002_5e134dcf7859e662.txt`
/// designs it: the in-memory array is the source of truth, kept oldest first (appends are O(1))
/// and shown newest first through a reversed view; every operation updates memory at once, never
/// throws, and sends a fire-and-forget command to a stateless disk actor (read, append, rewrite),
/// whose isolation keeps the writes in order. Initialisation returns at once and loads the file
/// in the background, merging entries appended meanwhile (loaded ones are older).
///
/// Two things Swift 6 asks for beyond the design: the manager is `@MainActor` (the UI's actor;
/// it holds mutable state observed by views) and entries are `Sendable` (they cross to the disk
/// actor). And one repair the design implies ("resolved on the next successful write"): after
/// a failed write the next command is a rewrite of the whole array, not an append.
@MainActor
@Observable
public final class ChronologicalHistoryManager<Entry: Codable & Sendable> {
    /// Oldest first.
    private var _entries: [HistoryEntry<Entry>] = []
    @ObservationIgnored private let disk: any HistoryDiskIO<Entry>
    /// A write failed: the file is behind memory until the next rewrite succeeds.
    @ObservationIgnored private var diskIsBehind = false
    /// The file is being read: changes stay in memory, and the merge's rewrite persists them.
    @ObservationIgnored private var isLoading = true
    /// The background load, for callers that want to know when it is over.
    @ObservationIgnored private var loading: Task<Void, Never>?
    /// The last disk command sent (each waits for the one before it through the actor's order).
    @ObservationIgnored private var lastWrite: Task<Void, Never>?

    /// All entries, latest first.
    public var entries: [HistoryEntry<Entry>] { _entries.reversed() }

    /// Returns at once with no entries; the file at `fileURL` is loaded in the background.
    public convenience init(fileURL: URL) {
        self.init(disk: DiskIOActor<Entry>(fileURL: fileURL))
    }

    /// The same over any disk (tests hold its read back, or make its writes fail).
    public init(disk: some HistoryDiskIO<Entry>) {
        self.disk = disk
        loading = Task { await self.loadAndMerge() }
    }

    /// Appends an entry with the current time; memory now, disk in the background.
    public func append(_ entry: Entry) {
        let wrapped = HistoryEntry(data: entry)
        _entries.append(wrapped)
        if isLoading { return }
        if diskIsBehind {
            write(.rewrite(_entries))
        } else {
            write(.append(wrapped))
        }
    }

    /// Deletes the entries with these ids; memory now, the file rewritten in the background.
    public func delete(ids: Set<UUID>) {
        _entries.removeAll { ids.contains($0.id) }
        if isLoading { return }
        write(.rewrite(_entries))
    }

    /// Waits until the background load and every disk command sent so far are done.
    public func settled() async {
        await loading?.value
        await lastWrite?.value
    }

    enum Command {
        case append(HistoryEntry<Entry>)
        case rewrite([HistoryEntry<Entry>])
    }

    private func write(_ command: Command) {
        let previous = lastWrite
        let disk = self.disk
        lastWrite = Task {
            await previous?.value
            let ok: Bool
            switch command {
            case .append(let entry): ok = await disk.append(entry)
            case .rewrite(let entries): ok = await disk.rewrite(entries)
            }
            if ok {
                if case .rewrite = command { self.diskIsBehind = false }
            } else {
                self.diskIsBehind = true
            }
        }
    }

    private func loadAndMerge() async {
        let read = await disk.read()
        isLoading = false
        guard let loaded = read else {
            // Memory stays valid; the next write brings the file up to date.
            diskIsBehind = true
            return
        }
        if _entries.isEmpty {
            // Nothing was added meanwhile: the loaded entries as they are, no rewrite.
            _entries = loaded
        } else {
            // Entries appended while the file was read are newer than all it held; they were
            // kept in memory only, so one rewrite persists everything.
            _entries = loaded + _entries
            write(.rewrite(_entries))
        }
    }
}
