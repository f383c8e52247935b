/// Runs `background` (a client's or a channel's I/O, a service's loop) beside `body`, and cancels
/// and awaits it when `body` returns or throws: the scoped lifetime of `withBusClient`,
/// `BusChannel.running` and the gateway's clients.
@discardableResult
public func whileRunning<T>(
    isolation: isolated (any Actor)? = #isolation, _ background: @escaping @Sendable () async -> Void, _ body: () async throws -> T
) async throws -> T {
    let outcome: Result<T, any Error> = await withTaskGroup(of: Void.self, isolation: isolation) { group in
        group.addTask { await background() }
        defer { group.cancelAll() }
        do {
            return .success(try await body())
        } catch {
            return .failure(error)
        }
    }
    return try outcome.get()
}
