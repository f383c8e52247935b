import Bus
import Logging
import ServiceLifecycle

/// Runs the dispatcher: feeds it the workers' messages, ticks it every `tick`, reconciles its
/// workers with the database every `reconcile`, and owns its writes (`Dispatcher.runWrites`). On
/// a graceful shutdown the channel closes, the loops end, and the writes in flight are finished
/// before `run` returns.
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
        await withTaskGroup(of: Void.self) { owner in
            owner.addTask { await dispatcher.runWrites() }
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
            await channel.shutdown()
            dispatcher.finishWrites()
        }
    }
}
