import Bus
import Foundation
import Logging
import Messages
import ServiceLifecycle
import Synchronization

/// A worker process's loop (Paranoid Pirate): connect to the jobs service, say `ready`, run what
/// is assigned (at most `capacity` at once), send heartbeats, progress and results; if the service
/// is silent for three heartbeat intervals, reconnect and say `ready` again.
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

    /// Jobs running now, by attempt, with their tasks.
    final class Running: Sendable {
        private let tasks = Mutex<[JobAttempt: Task<Void, Never>]>([:])
        private let cancelled = Mutex<Set<JobAttempt>>([])

        var attempts: [JobAttempt] { tasks.withLock { Array($0.keys) } }
        var count: Int { tasks.withLock { $0.count } }
        func add(_ attempt: JobAttempt, _ task: Task<Void, Never>) { tasks.withLock { $0[attempt] = task } }
        func remove(_ attempt: JobAttempt) { tasks.withLock { _ = $0.removeValue(forKey: attempt) }; cancelled.withLock { _ = $0.remove(attempt) } }
        func contains(_ attempt: JobAttempt) -> Bool { tasks.withLock { $0[attempt] != nil } }
        func cancel(_ attempt: JobAttempt) -> Bool {
            guard let task = tasks.withLock({ $0[attempt] }) else { return false }
            cancelled.withLock { _ = $0.insert(attempt) }
            task.cancel()
            return true
        }
        func wasCancelled(_ attempt: JobAttempt) -> Bool { cancelled.withLock { $0.contains(attempt) } }
    }

    /// When the jobs service was last heard from.
    final class LastHeard: Sendable {
        private let instant = Mutex(ContinuousClock.now)
        func touch() { instant.withLock { $0 = .now } }
        var silence: Duration { instant.withLock { $0 }.duration(to: .now) }
    }

    public func run() async throws {
        let running = Running()
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let channel = try await BusChannel.connect(configuration.endpoint, curve: configuration.curve, logger: logger)
            let ready = WorkerMessage.ready(WorkerReady(workerId: configuration.workerId, capacity: configuration.capacity, effects: effects))
            channel.send(ready)
            logger.info("connected", metadata: ["endpoint": "\(configuration.endpoint)", "capacity": "\(configuration.capacity)"])
            let lastHeard = LastHeard()
            await withGracefulShutdownHandler {
                await withTaskGroup(of: Void.self) { group in
                    group.addTask {
                        for await message in channel.incoming {
                            lastHeard.touch()
                            guard let decoded = BusChannel.decode(DispatcherMessage.self, message) else { continue }
                            handle(decoded, channel: channel, running: running, ready: ready)
                        }
                    }
                    group.addTask {
                        // Heartbeats out; silence in means the service is gone: reconnect.
                        while !Task.isCancelled {
                            try? await Task.sleep(for: configuration.heartbeat)
                            channel.send(WorkerMessage.heartbeat(running: running.attempts))
                            if lastHeard.silence > configuration.heartbeat * 3 {
                                logger.warning("jobs service silent; reconnecting")
                                return
                            }
                        }
                    }
                    await group.next()
                    group.cancelAll()
                }
            } onGracefulShutdown: {
                Task { await channel.shutdown() }
            }
            await channel.shutdown()
        }
        // Let the jobs in progress finish before the process exits.
        while running.count > 0 { try? await Task.sleep(for: .milliseconds(50)) }
    }

    private func handle(_ message: DispatcherMessage, channel: BusChannel, running: Running, ready: WorkerMessage) {
        switch message {
        case .heartbeat:
            break
        case .reconnect:
            channel.send(ready)
        case .refused(let attempt, let reason):
            logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
        case .cancel(let attempt):
            if running.cancel(attempt) {
                logger.info("cancelling", metadata: ["job": "\(attempt.jobId)"])
            }
        case .assign(let job):
            guard !running.contains(job.attempt) else { return }
            let task = Task {
                await execute(job, channel: channel, running: running)
            }
            running.add(job.attempt, task)
        }
    }

    private func execute(_ job: JobAssignment, channel: BusChannel, running: Running) async {
        var jobLogger = logger
        jobLogger[metadataKey: "job"] = "\(job.attempt.jobId)"
        jobLogger[metadataKey: "attempt"] = "\(job.attempt.attempt)"
        jobLogger.info("started", metadata: ["effect": "\(job.effect.id)"])
        let started = ContinuousClock.now
        do {
            let output = try await runner.run(job) { fraction in
                channel.send(WorkerMessage.progress(job.attempt, fraction: fraction))
            }
            if running.wasCancelled(job.attempt) {
                channel.send(WorkerMessage.cancelled(job.attempt))
                jobLogger.info("cancelled")
            } else {
                channel.send(WorkerMessage.done(job.attempt, output))
                jobLogger.info("done", metadata: ["duration": "\(started.duration(to: .now))"])
            }
        } catch {
            if running.wasCancelled(job.attempt) {
                channel.send(WorkerMessage.cancelled(job.attempt))
            } else {
                let effectError = error as? EffectError ?? EffectError("\(error)", retryable: true)
                channel.send(WorkerMessage.failed(job.attempt, error: effectError.description, retryable: effectError.retryable))
                jobLogger.warning("failed", metadata: ["error": "\(effectError.description)", "retryable": "\(effectError.retryable)"])
            }
        }
        running.remove(job.attempt)
    }
}
