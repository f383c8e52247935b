import Bus
import Logging
import ServiceLifecycle

/// Runs the dispatcher: runs its channel to the workers (`run` throws if it cannot be bound),
/// feeds it the workers' messages, ticks it every `tick`, reconciles its workers with the
/// database every `reconcile`, and owns its writes (`Dispatcher.runWrites`). On a graceful
/// shutdown the loops end, the channel closes, and the writes in flight are finished before `run`
/// returns.
public struct DispatcherService: Service {
    let dispatcher: Dispatcher
    let channel: BusChannel
    let tick: Duration
    let reconcile: Duration

    public init(dispatcher: Dispatcher, channel: BusChannel, tick: Duration = .milliseconds(200), reconcile: Duration = .seconds(1)) {
        self.dispatcher = dispatcher
        self.channel = channel
        self.tick = tick
        self.reconcile = reconcile
    }

    public func run() async throws {
        let served: Result<Void, any Error> = await withTaskGroup(of: Void.self) { owner in
            owner.addTask { await dispatcher.runWrites() }
            defer { dispatcher.finishWrites() }
            do {
                try await channel.running { await serve() }
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        try served.get()
    }

    private func serve() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await message in channel.incoming.cancelOnGracefulShutdown() { await dispatcher.receive(message) }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: tick)
                    await dispatcher.tick()
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: reconcile)
                    await dispatcher.reconcile()
                }
            }
            await group.next()
            group.cancelAll()
        }
    }
}
