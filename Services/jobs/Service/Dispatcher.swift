import Bus
import Foundation
import JobsCore
import Logging
import Messages
import Metrics
import Tracing

/// Hands queued jobs to workers, fairly, and watches the workers: the I/O around
/// `DispatchStateMachine`, which holds every rule.
///
/// Each event (a worker's message, a created job, a tick, the end of a write) goes into the state
/// machine, and the actions it answers are carried out here: messages are sent on the worker
/// channel at once, writes run concurrently in the task group of `runWrites` (owned by
/// `DispatcherService`, drained at shutdown) through the store's group committer, and each
/// write's outcome is fed back in as another event. So the actor never awaits a database in
/// the middle of a change, results arriving together are written together, and a worker hears
/// `recorded` only once its result is durable.
public actor Dispatcher {
    public typealias Machine = DispatchStateMachine<BusChannel.Peer>

    private let channel: BusChannel
    private let store: any JobsStore
    private let transfers: TransferSigner
    private let catalog: EffectCatalog
    private let logger: Logger
    private var machine: Machine
    private let failures: FailureLog
    /// The latest metrics each connected worker sent (labelled with its id), by connection.
    private var workerMetrics: [BusChannel.Peer: MetricsSection] = [:]
    /// Jobs ended each minute of the last hour, for the console.
    private var outcomes = RecentOutcomes()
    /// The largest metrics text kept from one worker.
    static let maxWorkerMetricsBytes = 256 << 10
    /// Writes handed to `runWrites`. Not otherwise bounded: each is about an attempt the state
    /// machine holds or a start it asked for, and those are bounded by the workers' capacity and
    /// the starts it hands out a tick.
    private let writes: AsyncStream<@Sendable () async -> Void>
    private let writesInput: AsyncStream<@Sendable () async -> Void>.Continuation

    public init(channel: BusChannel, store: any JobsStore, catalog: EffectCatalog, transfers: TransferSigner, proFirst: Bool = true,
                heartbeatInterval: Duration = .seconds(1), providerLimits: [String: Int] = [:], lostWorkerGrace: Duration = .seconds(30),
                logger: Logger) {
        self.channel = channel
        self.store = store
        self.transfers = transfers
        self.catalog = catalog
        self.logger = logger
        self.machine = Machine(catalog: catalog, configuration: .init(
            heartbeat: heartbeatInterval, proFirst: proFirst, providerLimits: providerLimits, lostWorkerGrace: lostWorkerGrace
        ))
        self.failures = FailureLog(logger: logger)
        (writes, writesInput) = AsyncStream.makeStream(of: (@Sendable () async -> Void).self)
    }

    /// Runs the dispatcher's writes, concurrently, until `finishWrites()`; then waits for those
    /// in flight. Its owner (`DispatcherService`) runs it for the life of the service.
    public nonisolated func runWrites() async {
        await withDiscardingTaskGroup { group in
            for await write in writes { group.addTask { await write() } }
        }
    }

    /// No more writes: `runWrites` returns once those in flight are done.
    public nonisolated func finishWrites() { writesInput.finish() }

    private func spawn(_ write: @escaping @Sendable () async -> Void) { writesInput.yield(write) }

    /// Jobs waiting for a worker, backoffs included.
    public var queuedCount: Int { machine.queuedCount }

    /// Queues jobs recovered from the database at start-up.
    public func load(_ jobs: [JobRecord]) {
        perform(machine.enqueue(jobs.map(Machine.queued), now: .now))
    }

    /// A provider's webhook came for a job: the worker waiting on its generation asks now.
    public func poke(jobId: String) {
        perform(machine.poke(jobId: jobId))
    }

    /// Generations waiting in providers' queues, held without a worker slot.
    public var awaitingCount: Int { machine.awaitingCount }

    /// Worker slots taken now.
    public var slotsHeld: Int { machine.slotsHeld }

    /// Puts operators' controls in force (a resumed effect's queued jobs go out at once).
    public func apply(_ controls: DispatchControls) {
        perform(machine.apply(controls, now: .now))
    }

    /// What operators read live: the workers, and each provider's jobs held and limit.
    public func live() -> LiveDispatch {
        LiveDispatch(
            workers: machine.workerViews(now: .now), activeByProvider: machine.activeByProvider(), providerLimits: machine.providerLimits,
            controls: machine.controls, lastHour: outcomes.lastHour(at: Date()), workerMetrics: workerMetrics.values.map(\.text)
        )
    }

    /// Queues a newly created job and hands it out if a worker is free.
    public func enqueue(_ job: JobRecord) {
        perform(machine.enqueue([Machine.queued(job)], now: .now))
    }

    /// Queues those of these queued jobs that this dispatcher does not know yet (created through
    /// another replica, or missed): a leader's catch-up with the table.
    public func enqueueUnknown(_ jobs: [JobRecord]) {
        let unknown = jobs.filter { $0.status == .queued && !machine.knows(jobId: $0.id, userId: $0.userId) }
        guard !unknown.isEmpty else { return }
        perform(machine.enqueue(unknown.map(Machine.queued), now: .now))
    }

    /// The live progress of every running job that has reported some.
    public var runningProgress: [String: Double] { machine.runningProgress }

    /// A cancel (or a purge) was recorded: drop the job from the queue, or tell the worker that
    /// runs it.
    public func cancel(_ job: JobRecord) {
        cancel(jobId: job.id, userId: job.userId)
    }

    /// A cancel (or a purge) of the job was recorded, by its id and owner.
    public func cancel(jobId: String, userId: String) {
        perform(machine.cancel(jobId: jobId, userId: userId))
    }

    /// Handles one message from a worker.
    public func receive(_ message: BusChannel.Message) {
        guard let peer = message.peer, let decoded = BusChannel.decode(WorkerMessage.self, message) else {
            logger.debug("dropped an undecodable worker message")
            return
        }
        if case .metrics(let text) = decoded, let id = machine.workerId(peer), text.utf8.count <= Self.maxWorkerMetricsBytes {
            workerMetrics[peer] = MetricsSection(labels: ["service": "worker", "worker": id], text: text)
        }
        perform(machine.receive(decoded, from: peer, now: .now))
    }

    /// Sends heartbeats, buries dead workers, releases due retries and dispatches.
    public func tick(now: ContinuousClock.Instant = .now) {
        perform(machine.tick(now: now))
        workerMetrics = workerMetrics.filter { machine.workerId($0.key) != nil }
    }

    /// Finds processing jobs that no worker holds under their current attempt and, once that
    /// has lasted the grace period, queues them again. Runs every second or so.
    public func reconcile(now: ContinuousClock.Instant = .now) async {
        let processing: [JobAttempt]
        do {
            processing = try await store.processingAttempts()
        } catch is CancellationError {
            return
        } catch {
            failures.record("reconcile", "cannot read processing jobs to reconcile: \(error)")
            return
        }
        perform(machine.reconcile(processing: processing, now: now))
    }

    /// The latest metrics of each connected worker, labelled with its id.
    public func workerSections() -> [MetricsSection] {
        workerMetrics.filter { machine.workerId($0.key) != nil }.values.sorted { ($0.labels["worker"] ?? "") < ($1.labels["worker"] ?? "") }
    }

    /// The job as stored, with the live progress of a running attempt laid over it.
    public func withLiveProgress(_ job: JobRecord) -> JobRecord {
        guard job.status == .processing, let fraction = machine.progress(of: [job.id])[job.id] else { return job }
        var live = job
        live.progress = fraction
        return live
    }

    /// The jobs as stored, each with its live progress laid over it.
    public func withLiveProgress(_ jobs: [JobRecord]) -> [JobRecord] {
        jobs.map { withLiveProgress($0) }
    }

    /// The live progress of those of these jobs that are running and have reported some.
    public func liveProgress(of ids: [String]) -> [String: Double] {
        machine.progress(of: ids)
    }

    // MARK: Carrying out actions

    /// Carries out the actions of one event. Its messages leave at the end, those to a worker
    /// that takes batches in one (`all`), in order; its starts are written together, and so are
    /// its results.
    private func perform(_ actions: [Machine.Action]) {
        var outgoing = Outgoing()
        var starts: [Machine.Start] = []
        var results: [Report] = []
        for action in actions {
            switch action {
            case .send(let peer, .assign(var job)):
                // The state machine decides; the URLs are signed here, on the way out. The
                // assignment joins the job's trace, and the worker's run continues from it.
                job.traceParent = BusTracing.mark("jobs.dispatch", continuing: job.traceParent, ofKind: .producer, attributes: [
                    "photoedit.job.id": job.attempt.jobId, "photoedit.job.attempt": "\(job.attempt.attempt)", "photoedit.effect": job.effect.id,
                ])
                outgoing.append(.assign(transfers.signed(job)), to: peer)
            case .send(let peer, let message):
                outgoing.append(message, to: peer)
            case .renew(let peer, let attempt):
                spawn { await self.renew(attempt, for: peer) }
            case .recordSubmission(let peer, let attempt, let request):
                spawn { await self.writeSubmission(request, of: attempt, from: peer) }
            case .start(let more):
                starts += more
            case .record(let peer, let attempt, let result):
                results.append(Report(peer: peer, attempt: attempt, result: result))
            case .requeue(let attempt, let reason, let cause):
                spawn { await self.writeRequeue(attempt, reason: reason, cause: cause) }
            case .lookUp(let peer, let attempts):
                spawn { await self.lookUp(attempts, for: peer) }
            case .workerJoined(let id, let capacity, let heartbeat, let connected):
                JobsMetrics.workersConnected.record(connected)
                logger.info("worker ready", metadata: ["worker": "\(id)", "capacity": "\(capacity)", "heartbeat-ms": "\(heartbeat.wholeMilliseconds)"])
            case .workerLost(let id, let jobs, let connected):
                JobsMetrics.workersConnected.record(connected)
                logger.warning("worker lost", metadata: [
                    "worker": "\(id)", "jobs": "\(jobs)", "generations-waiting-for-lost-workers": "\(machine.strandedCount)",
                ])
            case .workerLeft(let id, let connected):
                JobsMetrics.workersConnected.record(connected)
                logger.info("worker left", metadata: ["worker": "\(id)"])
            case .finished(let job, let since):
                JobsMetrics.finished(job, runningSince: since, provider: catalog.provider(of: job.effectId))
                outcomes.record(job.status, at: Date())
            case .firstAssignment(let job):
                JobsMetrics.waitBeforeAssignment.recordSeconds(max(0, Date().timeIntervalSince(job.createdAt)))
            case .refused(let attempt, let reason):
                logger.warning("result refused", metadata: ["job": "\(attempt.jobId)", "attempt": "\(attempt.attempt)", "reason": "\(reason)"])
            }
        }
        if !starts.isEmpty || !results.isEmpty { spawn { [starts, results] in await self.write(starts: starts, results: results) } }
        for (peer, messages) in outgoing.byPeer {
            if messages.count > 1, machine.takesBatches(peer) {
                for start in stride(from: 0, to: messages.count, by: workerProtocolMaxBatch) {
                    channel.send(DispatcherMessage.all(Array(messages[start..<min(start + workerProtocolMaxBatch, messages.count)])), to: peer)
                }
            } else {
                for message in messages { channel.send(message, to: peer) }
            }
        }
    }

    /// The messages of one event, by worker, each worker's in order.
    struct Outgoing {
        var byPeer: [(BusChannel.Peer, [DispatcherMessage])] = []

        mutating func append(_ message: DispatcherMessage, to peer: BusChannel.Peer) {
            if let index = byPeer.firstIndex(where: { $0.0 == peer }) {
                byPeer[index].1.append(message)
            } else {
                byPeer.append((peer, [message]))
            }
        }
    }

    /// A worker's result to write.
    struct Report: Sendable {
        var peer: BusChannel.Peer
        var attempt: JobAttempt
        var result: Machine.WorkerResult
    }

    /// Writes the starts and results of one event as one batch of the store's (one transaction
    /// on SQLite): the results of jobs that ended with the starts of those their slots go to.
    /// A worker whose result's write fails still holds the attempt and sends the result again
    /// with its next heartbeat; a start that fails leaves its job queued.
    private func write(starts: [Machine.Start], results: [Report]) async {
        var workers: [String: String] = [:]
        for start in starts { workers[start.job.jobId] = machine.workerId(start.peer) }
        let written = await store.write(starts: starts.map(\.job.jobId), workers: workers, results: results.map { ($0.attempt, $0.result) }, now: Date())
        var actions: [Machine.Action] = []
        for (report, written) in zip(results, written.results) {
            let outcome: Machine.RecordOutcome
            switch written {
            case .success(let (stored, retryAfter)):
                failures.recovered("record")
                switch stored {
                case .applied(let job): outcome = .applied(job, retryAfter: retryAfter)
                case .alreadyRecorded: outcome = .alreadyRecorded
                case .refused(let reason): outcome = .refused(reason)
                }
            case .failure(let error):
                failures.record("record", "cannot record workers' results yet; they are kept and sent again: \(error)")
                outcome = .failed
            }
            actions += machine.recorded(report.attempt, from: report.peer, outcome: outcome, now: .now)
        }
        if !starts.isEmpty {
            let outcomes = written.starts.map { result -> Machine.StartOutcome in
                switch result {
                case .success(let started):
                    failures.recovered("start")
                    return started.map { .started($0) } ?? .gone
                case .failure(let error):
                    failures.record("start", "cannot start jobs yet; they stay queued: \(error)")
                    return .failed
                }
            }
            actions += machine.started(Array(zip(starts, outcomes)), now: .now)
        }
        perform(actions)
    }

    /// Writes the provider request an attempt submitted; the worker sends it again until it
    /// hears that it is recorded.
    private func writeSubmission(_ request: ProviderRequest, of attempt: JobAttempt, from peer: BusChannel.Peer) async {
        let outcome: Machine.SubmissionOutcome
        do {
            switch try await store.recordSubmission(attempt, request) {
            case .applied, .alreadyRecorded: outcome = .recorded
            case .refused(let reason): outcome = .refused(reason)
            }
            failures.recovered("submission")
        } catch {
            failures.record("submission", "cannot record provider requests yet; workers send them again: \(error)")
            outcome = .failed
        }
        perform(machine.submissionRecorded(attempt, from: peer, outcome: outcome, now: .now))
    }

    /// Queues a processing attempt again (fenced: nothing happens if it is no longer current).
    private func writeRequeue(_ attempt: JobAttempt, reason: String, cause: Machine.RequeueCause) async {
        var requeued: JobRecord?
        do {
            requeued = try await store.requeue(attempt, reason: reason, now: Date())
            if requeued?.status == .queued {
                Counter(label: "jobs_requeued_total", dimensions: [("cause", cause.rawValue)]).increment()
            }
        } catch {
            failures.record("requeue", "cannot requeue jobs yet; the next reconcile tries again: \(error)")
        }
        perform(machine.requeued(requeued, now: .now))
    }

    /// Signs fresh URLs for an attempt a worker holds, from the job as stored (its image, its
    /// effect): a worker cannot name the keys it is given.
    private func renew(_ attempt: JobAttempt, for peer: BusChannel.Peer) async {
        guard let job = try? await store.jobs([attempt.jobId]).first, job.status == .processing, job.attempts == attempt.attempt,
              let effect = catalog.effect(job.effectId) else { return }
        let transfer = transfers.transfer(attempt, userId: job.userId, imageKey: job.imageKey, effect: effect)
        channel.send(DispatcherMessage.renewed(attempt, transfer), to: peer)
    }

    /// Reads the jobs a worker names that nobody holds here; those still processing under the
    /// named attempt are its again.
    private func lookUp(_ attempts: [JobAttempt], for peer: BusChannel.Peer) async {
        let stored = (try? await store.jobs(attempts.map(\.jobId))) ?? []
        let named = Set(attempts)
        let processing = stored.filter { $0.status == .processing && named.contains(JobAttempt(jobId: $0.id, attempt: $0.attempts)) }
        let current = processing.map { JobAttempt(jobId: $0.id, attempt: $0.attempts) }
        let effects = Dictionary(processing.map { ($0.id, $0.effectId) }, uniquingKeysWith: { first, _ in first })
        perform(machine.claimed(current, by: peer, effects: effects, now: .now))
    }
}
