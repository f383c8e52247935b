import Foundation
import Synchronization

/// Blob metadata remembered for `lifetime`, so a hot path (every job creation checks its upload's
/// owner) does not ask the store each time. A blob's owner, type and size never change while it
/// exists; what the lifetime bounds is how long a deleted blob still looks present (a job created
/// on it then fails when the worker finds no image). Absent blobs are not remembered. At most
/// `capacity` entries; past it the cache starts over.
public final class BlobMetadataCache<Value: Sendable>: Sendable {
    private let lifetime: Duration
    private let capacity: Int
    private let now: @Sendable () -> ContinuousClock.Instant
    private let entries = Mutex<[String: (value: Value, until: ContinuousClock.Instant)]>([:])

    public init(lifetime: Duration = .seconds(60), capacity: Int = 10_000, now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.lifetime = lifetime
        self.capacity = capacity
        self.now = now
    }

    /// The value of `key`, from memory if found within the lifetime, else from `load` (nil is
    /// not remembered).
    public func value(of key: String, load: () async throws -> Value?) async throws -> Value? {
        let now = now()
        if let hit = entries.withLock({ $0[key] }), now < hit.until { return hit.value }
        guard let value = try await load() else { return nil }
        entries.withLock { entries in
            if entries.count >= capacity { entries.removeAll(keepingCapacity: true) }
            entries[key] = (value, now.advanced(by: lifetime))
        }
        return value
    }

    /// Forgets `key` (its blob was deleted or refused).
    public func forget(_ key: String) {
        _ = entries.withLock { $0.removeValue(forKey: key) }
    }
}
