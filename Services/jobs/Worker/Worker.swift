import Blobs
import Bus
import Foundation
import Logging
import Messages
import ServiceKit
import ServiceLifecycle
import Synchronization

/// A worker process's loop (Paranoid Pirate): connect to the jobs service, say `ready`, run what
/// is assigned (at most `capacity` at once), send heartbeats, progress and results; if the service
/// is silent for three heartbeat intervals, reconnect and say `ready` again. A result is sent
/// again with every heartbeat, across reconnects, until the service answers that it is recorded
/// (or refused): a result lost on the way, or one the service could not write, is never lost.
///
/// This is the shell: what the worker decides is `WorkerState`, a pure state machine behind
/// `WorkerCore`'s lock; each job runs in `WorkerJob.swift`.
public struct Worker: Service {
    let configuration: WorkerConfiguration
    let runner: EffectRunner
    let effects: [String]
    let logger: Logger

    public init(configuration: WorkerConfiguration, runner: EffectRunner, effects: [String], logger: Logger) {
        self.configuration = configuration
        self.runner = runner
        self.effects = effects
        self.logger = logger
    }

    /// How often the worker sends its metrics to the jobs service.
    static let metricsInterval = Duration.seconds(5)

    public func run() async throws {
        WorkerMetrics.inProgress.set(0)
        let ready = WorkerMessage.ready(WorkerReady(
            workerId: configuration.workerId, capacity: configuration.capacity, effects: effects,
            heartbeatMilliseconds: Int(configuration.heartbeat.wholeMilliseconds), prefetch: configuration.prefetch, batches: true,
            host: ProcessInfo.processInfo.hostName, version: BuildInfo.version
        ))
        let state = WorkerState(
            capacity: configuration.capacity, maxDetached: runner.providers.maxGenerations, heartbeat: configuration.heartbeat,
            metricsInterval: Self.metricsInterval, ready: ready, now: .now
        )
        let core = WorkerCore(state: state, connectedMetadata: [
            "endpoint": "\(configuration.endpoint)", "capacity": "\(configuration.capacity)", "prefetch": "\(configuration.prefetch)",
        ], logger: logger)
        try await withThrowingDiscardingTaskGroup { jobs in
            jobs.addTask {
                defer {
                    // Stopped with jobs still held: the service fell silent while the worker was
                    // leaving (a Ctrl-C stops the whole stack), so no one waits for their results.
                    let handedBack = core.apply(nil) { $0.handBackAll() }.count
                    if handedBack > 0 { logger.info("stopping without the jobs service; jobs handed back", metadata: ["jobs": "\(handedBack)"]) }
                    core.endLaunches()
                }
                try await connect(core)
            }
            // Each job runs in a task of this group: cancelled with it, and waited for before the
            // process exits.
            for await launch in core.launches {
                jobs.addTask { await runJob(launch.job, channel: launch.channel, core: core) }
            }
        }
    }

    /// Connects, and connects again whenever the service falls silent, until the worker stops.
    /// "connected" is logged once the service has answered, not when the socket connects: a worker
    /// with the wrong keys connects its socket and is never answered. A service that never answers
    /// is logged once (then at debug) until it does; the refusal's reason, when libzmq knows it, is
    /// the channel's line (`BusChannel`).
    private func connect(_ core: WorkerCore) async throws {
        var unansweredLogged = false
        let handshakeFailures = HandshakeFailures()
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let channel = BusChannel.connecting(
                configuration.endpoint, curve: configuration.curve, encoding: configuration.busEncoding, logger: logger, handshakeFailures: handshakeFailures
            )
            defer {
                if core.state.withLock({ $0.heard }) {
                    unansweredLogged = false
                } else if !Task.isCancelled && !Task.isShuttingDownGracefully {
                    let metadata: Logger.Metadata = [
                        "endpoint": "\(configuration.endpoint)",
                        "check": "the endpoint is reachable from this host; BUS_CURVE_PUBLIC is the services' public key; this worker's key is listed as a worker in jobs' BUS_CURVE_CLIENTS",
                    ]
                    if unansweredLogged {
                        logger.debug("the jobs service still does not answer; trying again", metadata: metadata)
                    } else {
                        logger.warning("the jobs service does not answer; trying again", metadata: metadata)
                        unansweredLogged = true
                    }
                }
            }
            try await channel.running {
                core.apply(channel) { $0.connected(now: .now) }
                logger.debug("ready sent", metadata: ["endpoint": "\(configuration.endpoint)"])
                await withTaskGroup(of: Void.self) { group in
                    group.addTask {
                        for await message in channel.incoming {
                            guard let decoded = BusChannel.decode(DispatcherMessage.self, message) else { continue }
                            core.apply(channel) { $0.received(decoded, now: .now) }
                        }
                    }
                    group.addTask {
                        // Heartbeats out (metrics with the first and every 5 s); silence in means
                        // the service is gone: reconnect.
                        while !Task.isCancelled {
                            try? await Task.sleep(for: configuration.heartbeat)
                            if core.apply(channel, { $0.tick(now: .now) }).contains(.reconnect) { return }
                        }
                    }
                    group.addTask {
                        // Stopping (SIGTERM): leave, then close this connection.
                        guard (try? await gracefulShutdown()) != nil else { return }
                        await leave(channel: channel, core: core)
                    }
                    await group.next()
                    group.cancelAll()
                }
            }
        }
    }

    /// Stopping (SIGTERM): tells the service to send no more jobs, gives back the prefetched ones
    /// that have not started, finishes the running ones and waits for their results to be
    /// recorded and for the service's `leaveNoted` (at most three heartbeat intervals after the
    /// last one ends), so that a worker scaled down loses no work and leaves no job waiting for
    /// it to be declared dead. Jobs assigned before the service heard `leaving` arrive before its
    /// answer, and are given back as they come (`WorkerState`). A service that falls silent
    /// meanwhile (three heartbeats: the whole stack is stopping) ends the wait: the worker stops,
    /// and the jobs it still holds are handed back (`run`), as a lost connection hands them back.
    private func leave(channel: BusChannel, core: WorkerCore) async {
        var returned = 0
        core.apply(channel) { state in
            let (given, actions) = state.leave()
            returned = given.count
            return actions
        }
        logger.info("stopping", metadata: ["running": "\(core.state.withLock { $0.heldCount })", "given-back": "\(returned)"])
        await core.untilEmpty()
        let deadline = ContinuousClock.now.advanced(by: configuration.heartbeat * 3)
        // (Cancelled: the service fell silent meanwhile, and the worker stops without it.)
        while !Task.isCancelled, !core.state.withLock({ $0.leaveDone }), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        if !core.state.withLock({ $0.leaveNoted }) {
            logger.warning("stopping without the jobs service's answer; jobs sent meanwhile wait to be declared lost")
        }
    }
}
