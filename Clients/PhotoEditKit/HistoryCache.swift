import Foundation
import Observation

/// The user's edits on the device: kept in a `ChronologicalHistoryManager` (a JSON-lines file),
/// brought up to date from `GET /api/v1/history/changes`, and served from the file when the
/// gateway cannot be reached. Deleting is optimistic: the item leaves at once and comes back if
/// the gateway refuses.
@MainActor
@Observable
public final class HistoryCache {
    /// One cached item, or the changes token (a single entry carrying the position in the feed).
    public struct Record: Codable, Sendable {
        public var item: HistoryItem?
        public var token: String?
    }

    private let client: PhotoEditClient
    private let store: ChronologicalHistoryManager<Record>
    /// Whether the last refresh reached the gateway.
    public private(set) var isOffline = false

    /// The cache of `client`'s user in the file at `fileURL` (one file per user).
    public init(client: PhotoEditClient, fileURL: URL) {
        self.client = client
        self.store = ChronologicalHistoryManager(fileURL: fileURL)
    }

    /// The cached items, newest first.
    public var items: [HistoryItem] {
        store.entries.compactMap(\.data.item).sorted { ($0.createdAt, $0.id) > ($1.createdAt, $1.id) }
    }

    /// Where the cache is in the changes feed.
    var token: String? { store.entries.first { $0.data.token != nil }?.data.token }

    /// Waits until the file is loaded and written.
    public func settled() async { await store.settled() }

    /// Applies every change since the last refresh. Offline (or any failure): the cached items
    /// stay as they are, `isOffline` says so, and the error is returned.
    @discardableResult
    public func refresh() async -> PhotoEditError? {
        await store.settled()
        var token = self.token
        do {
            while true {
                let page = try await client.historyChanges(since: token)
                apply(page.changes)
                token = page.nextToken
                if !page.hasMore { break }
            }
            remember(token)
            isOffline = false
            return nil
        } catch {
            isOffline = error == .offline
            return error
        }
    }

    /// Deletes an item: gone from the cache at once, back if the gateway refuses (a 404 means it
    /// is gone there too).
    public func delete(_ jobId: String) async -> PhotoEditError? {
        let removed = store.entries.filter { $0.data.item?.id == jobId }
        store.delete(ids: Set(removed.map(\.id)))
        do {
            try await client.delete(jobId)
            return nil
        } catch .notFound {
            return nil
        } catch {
            for entry in removed.reversed() { store.append(entry.data) }
            return error
        }
    }

    private func apply(_ changes: [HistoryChanges.Change]) {
        for change in changes {
            switch change {
            case .upsert(let item):
                store.delete(ids: Set(store.entries.filter { $0.data.item?.id == item.id }.map(\.id)))
                store.append(Record(item: item))
            case .delete(let id):
                store.delete(ids: Set(store.entries.filter { $0.data.item?.id == id }.map(\.id)))
            }
        }
    }

    private func remember(_ token: String?) {
        guard let token, token != self.token else { return }
        store.delete(ids: Set(store.entries.filter { $0.data.token != nil }.map(\.id)))
        store.append(Record(token: token))
    }
}
