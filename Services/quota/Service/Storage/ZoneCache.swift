import Synchronization

/// The time zones a quota replica knows its users to have, so that it can make a reservation's
/// window keys before PostgreSQL reads the user's row (`quota_batch_decide` checks each against
/// the row, and answers the zones that differ instead of deciding). Only users with a zone are
/// kept: most have none, and an unknown user is taken to have none. It forgets everything once it
/// holds `capacity` users (each forgotten one costs a batch one more call, once).
final class ZoneCache: Sendable {
    private let zones = Mutex<[String: String]>([:])
    let capacity: Int

    init(capacity: Int = 100_000) {
        self.capacity = capacity
    }

    /// The zone `user` is known to have; nil: none, or not known.
    func zone(of user: String) -> String? {
        zones.withLock { $0[user] }
    }

    /// Records the zone PostgreSQL holds for `user` (nil: none).
    func learn(user: String, zone: String?) {
        zones.withLock { zones in
            guard let zone else {
                zones[user] = nil
                return
            }
            if zones.count >= capacity { zones.removeAll() }
            zones[user] = zone
        }
    }
}
