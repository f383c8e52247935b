import Blobs
import Foundation
import Synchronization
import Testing

@Suite("Blob metadata cache", .timeLimit(.minutes(5)))
struct BlobMetadataCacheTests {
    @Test func aValueIsLoadedOnceWithinItsLifetimeAndAgainAfter() async throws {
        let clock = Mutex(ContinuousClock.now)
        let loads = Mutex(0)
        let stored = Mutex<String?>("u")
        let cache = BlobMetadataCache<String>(lifetime: .seconds(60), now: { clock.withLock { $0 } })
        func read() async throws -> String? {
            try await cache.value(of: "uploads/u/a.jpg") {
                loads.withLock { $0 += 1 }
                return stored.withLock { $0 }
            }
        }
        // Read once, then gone from the store, still known within the lifetime: no second load
        #expect(try await read() == "u")
        stored.withLock { $0 = nil }
        #expect(try await read() == "u")
        #expect(loads.withLock { $0 } == 1)
        // Past the lifetime it is loaded again, and found absent; absence is not remembered
        clock.withLock { $0 = $0.advanced(by: .seconds(61)) }
        #expect(try await read() == nil)
        stored.withLock { $0 = "v" }
        #expect(try await read() == "v")
        #expect(loads.withLock { $0 } == 3)
        // Forgotten: loaded again at once
        cache.forget("uploads/u/a.jpg")
        stored.withLock { $0 = "w" }
        #expect(try await read() == "w")
    }
}
