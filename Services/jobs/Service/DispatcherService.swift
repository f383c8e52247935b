import Bus
import Logging
import ServiceLifecycle

/// Runs the dispatcher: feeds it the workers' messages, ticks it every `tick` and reconciles
/// its workers with the database every `reconcile`.
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
        await withGracefulShutdownHandler {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await message in channel.incoming { await dispatcher.receive(message) }
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
        } onGracefulShutdown: {
            Task { await channel.shutdown() }
        }
    }
}
