import Foundation
import Logging
import ServiceLifecycle

/// One entry of an outbox: written in the same transaction as the change that caused it, and
/// kept until its receiver has acknowledged it.
public struct OutboxItem<Kind: Sendable>: Sendable {
    /// The entry's key in its outbox.
    public var id: String
    public var kind: Kind
    /// The job it is about (for logs).
    public var jobId: String
    /// Failed deliveries so far.
    public var attempts: Int

    public init(id: String, kind: Kind, jobId: String, attempts: Int) {
        self.id = id
        self.kind = kind
        self.jobId = jobId
        self.attempts = attempts
    }
}

/// An entry whose delivery failed, to be tried again at `at` with `attempts` counted.
public struct OutboxRetry: Sendable, Equatable {
    public var id: String
    public var attempts: Int
    public var at: Date

    public init(id: String, attempts: Int, at: Date) {
        self.id = id
        self.attempts = attempts
        self.at = at
    }
}

/// What a relay needs of an outbox: the entries due, oldest first, and what became of them.
/// Each service's database implements it for each of its outboxes.
public protocol Outbox<Kind>: Sendable {
    associatedtype Kind: Sendable
    /// Up to `limit` entries whose next attempt is due at `now`, oldest first.
    func due(now: Date, limit: Int) async throws -> [OutboxItem<Kind>]
    /// The receiver has them: they leave the outbox.
    func acknowledge(_ ids: [String]) async throws
    /// Deliveries failed: each entry is tried again at its `at`, with its `attempts` counted.
    /// All in one write: a round that fails as a whole (its receiver down) puts back a whole
    /// batch, which one by one cost a transaction and an fsync each.
    func retry(_ entries: [OutboxRetry]) async throws
}

/// What a producer needs of its outbox's relay: to say there is something to deliver now.
public protocol OutboxWaker: Sendable {
    func wake()
}

/// What became of one entry a relay handed to its receiver.
public enum OutboxOutcome: Sendable, Equatable {
    /// Applied (or not applicable, which is as final): acknowledge it.
    case delivered
    /// Not now: try again after the backoff.
    case retry
}

/// Ways of handing entries to a receiver.
public enum OutboxDeliveries {
    /// One entry at a time, stopping after the first that must wait (its receiver is likely
    /// down: the rest would each wait out a timeout).
    public static func oneByOne<Kind>(_ items: [OutboxItem<Kind>], _ send: (OutboxItem<Kind>) async -> OutboxOutcome) async -> [OutboxOutcome] {
        var outcomes: [OutboxOutcome] = []
        for item in items {
            let outcome = await send(item)
            outcomes.append(outcome)
            if outcome == .retry { break }
        }
        return outcomes
    }
}

/// The one retry policy of every outbox: 1 s after the first failure, doubling to 30 s.
public enum OutboxBackoff {
    public static func delay(afterAttempts attempts: Int) -> TimeInterval {
        min(30, pow(2, Double(min(10, max(0, attempts - 1)))))
    }
}

/// Delivers an outbox: every `interval` (or at once after `wake()`, or while full batches keep
/// coming), hands the due entries to `deliver`, acknowledges those delivered and puts the others
/// back with `OutboxBackoff`. `deliver` answers an outcome for each entry it reached, in order;
/// entries past the outcomes it answers (it stopped early, say because the receiver is down) stay
/// as they were for the next round. A receiver that stops taking entries is logged once, and
/// once more when it takes them again. Entries not delivered stay in the outbox across restarts.
public struct OutboxRelay<Box: Outbox>: Service, OutboxWaker {
    let outbox: Box
    /// What it delivers, for logs ("quota settlements").
    let name: String
    let batchSize: Int
    let interval: Duration
    let deliver: @Sendable ([OutboxItem<Box.Kind>]) async -> [OutboxOutcome]
    let logger: Logger
    private let signals: AsyncStream<Void>
    private let signal: AsyncStream<Void>.Continuation

    public init(
        _ name: String, outbox: Box, batchSize: Int = 100, interval: Duration = .milliseconds(200), logger: Logger,
        deliver: @escaping @Sendable ([OutboxItem<Box.Kind>]) async -> [OutboxOutcome]
    ) {
        self.name = name
        self.outbox = outbox
        self.batchSize = max(1, batchSize)
        self.interval = interval
        self.deliver = deliver
        self.logger = logger
        (signals, signal) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Delivers what is due now rather than at the next interval.
    public func wake() { signal.yield() }

    public func run() async throws {
        await cancelWhenGracefulShutdown { [self] in
            await withTaskGroup(of: Void.self) { group in
                // The interval's wake-up, beside `wake()`'s
                group.addTask { [signal, interval] in
                    while !Task.isCancelled {
                        try? await Task.sleep(for: interval)
                        signal.yield()
                    }
                }
                group.addTask { [self] in
                    var failing = false
                    for await _ in signals {
                        while !Task.isCancelled {
                            do {
                                let round = try await relayDue()
                                if round.retried > 0, !failing { logger.warning("\(name) not delivered; they stay in the outbox and are retried") }
                                if round.retried == 0, round.delivered > 0, failing { logger.info("\(name) delivered again") }
                                if round.retried > 0 { failing = true } else if round.delivered > 0 { failing = false }
                                if round.delivered < batchSize || round.retried > 0 { break }
                            } catch where Task.isCancelled {
                                break
                            } catch {
                                if !failing { logger.error("\(name): outbox unreadable", metadata: ["error": "\(error)"]) }
                                failing = true
                                break
                            }
                        }
                    }
                }
                await group.next()
                group.cancelAll()
            }
        }
        signal.finish()
    }

    /// One round: the due entries handed over once; how many were delivered and put back.
    @discardableResult
    public func relayDue(now: Date = Date()) async throws -> (delivered: Int, retried: Int) {
        let due = try await outbox.due(now: now, limit: batchSize)
        guard !due.isEmpty else { return (0, 0) }
        let outcomes = await deliver(due)
        var delivered: [String] = []
        var retried: [OutboxRetry] = []
        for (item, outcome) in zip(due, outcomes) {
            switch outcome {
            case .delivered:
                delivered.append(item.id)
            case .retry:
                let attempts = item.attempts + 1
                retried.append(OutboxRetry(id: item.id, attempts: attempts, at: now.addingTimeInterval(OutboxBackoff.delay(afterAttempts: attempts))))
            }
        }
        if !retried.isEmpty { try await outbox.retry(retried) }
        if !delivered.isEmpty { try await outbox.acknowledge(delivered) }
        return (delivered.count, retried.count)
    }
}
