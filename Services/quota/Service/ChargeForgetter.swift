import Bus
import Foundation
import Logging
import Metrics
import ServiceKit
import ServiceLifecycle

/// Forgets charges once the idempotency window has passed since they settled
/// (`IDEMPOTENCY_WINDOW_S`, a day as Stripe keeps its keys): the ledger then holds a window's
/// charges, not every charge ever made, and (on SQLite) memory knows every job id it holds.
/// A job id forgotten and sent again is charged afresh by quota; the gateway refuses such a
/// creation (409 `idempotency_key_expired`) and gives that charge back, so nothing is charged
/// twice. Reservations are never forgotten: the stale-reservation resolver settles them.
public struct ChargeForgetter: Service {
    let store: any QuotaStore
    let window: Duration
    let interval: Duration
    let logger: Logger
    /// Charges deleted a statement, and statements a round (the rest wait for the next round).
    static let chunk = 5_000
    static let chunksPerRound = 20
    private static let forgotten = Counter(label: "quota_charges_forgotten_total")

    public init(store: any QuotaStore, window: Duration, logger: Logger) {
        self.store = store
        self.window = window
        // A quarter of the window, from a fifth of a second to a minute: a charge is kept at
        // most that much longer than the window.
        interval = min(.seconds(60), max(.milliseconds(200), window / 4))
        self.logger = logger
    }

    public func run() async throws {
        await Periodic.run(every: interval, logger: logger, failure: "forgetting settled charges failed") {
            try await forget(now: Date())
        }
    }

    /// One round: forgets what settled before `now` minus the window; answers how many.
    @discardableResult
    public func forget(now: Date) async throws -> Int {
        let cutoff = now.addingTimeInterval(-Double(window.wholeMilliseconds) / 1000)
        var total = 0
        for _ in 0..<Self.chunksPerRound {
            let count = try await store.forget(settledBefore: cutoff, limit: Self.chunk)
            total += count
            if count < Self.chunk { break }
        }
        if total > 0 {
            Self.forgotten.increment(by: total)
            logger.debug("settled charges forgotten", metadata: ["count": "\(total)"])
        }
        return total
    }
}
