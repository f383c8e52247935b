import Foundation
import Messages
import Synchronization

/// The effect catalogue as the gateway needs it to charge a job: each effect's price, read from
/// the jobs service (`jobs.effects`) and kept for `lifetime`, so a creation costs no extra bus
/// call. An id it does not know makes it read again at once (an effect the operator just added),
/// at most once a second; an id still unknown is refused as jobs would refuse it, before any
/// credit is reserved.
final class EffectPrices: Sendable {
    let clients: ServiceClients
    let lifetime: Duration
    private let state = Mutex<(list: EffectList?, fetchedAt: ContinuousClock.Instant?)>((nil, nil))

    init(clients: ServiceClients, lifetime: Duration = .seconds(5)) {
        self.clients = clients
        self.lifetime = lifetime
    }

    /// The catalogue, read again when older than `lifetime`.
    func list() async throws -> EffectList {
        let (cached, fetchedAt) = state.withLock { ($0.list, $0.fetchedAt) }
        if let cached, let fetchedAt, fetchedAt.duration(to: .now) < lifetime { return cached }
        return try await refresh()
    }

    /// The effect `id` names (an alias included), with its price now.
    func effect(_ id: String) async throws -> EffectDescription {
        var list = try await list()
        if list.effect(id) == nil, state.withLock({ $0.fetchedAt.map { $0.duration(to: .now) >= .seconds(1) } ?? true }) {
            list = try await refresh()
        }
        guard let effect = list.effect(id) else {
            throw Problem(BusError(Jobs.ErrorCode.unknownEffect, "no effect '\(id.prefix(64))'; effects: \(list.effects.map(\.id).joined(separator: ", "))"), service: "jobs")
        }
        return effect
    }

    private func refresh() async throws -> EffectList {
        let list = try await clients.call(.jobs, Jobs.effects, Empty())
        state.withLock { $0 = (list, .now) }
        return list
    }
}
