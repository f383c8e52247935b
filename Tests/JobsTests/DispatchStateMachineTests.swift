import Foundation
import JobsCore
import Messages
import Testing

/// The dispatcher's rules, driven by hand: no sockets, no processes, no sleeps. The clock is a
/// variable the test moves. Writes the machine asks for are carried out by `Harness` on rows in
/// memory with the same `JobRules` the store uses, held back when a test wants to act while one
/// is in flight.
@Suite("Dispatch state machine", .timeLimit(.minutes(5)))
struct DispatchStateMachineTests {
    typealias Machine = DispatchStateMachine<String>

    struct Harness {
        var machine: Machine
        var now = ContinuousClock.now
        var date = Date(timeIntervalSince1970: 1_800_000_000)
        var rows: [String: JobRecord] = [:]
        let retry = RetryPolicy(maxAttempts: 3, baseDelay: .seconds(1), maxDelay: .seconds(60))
        /// Messages sent, by worker, in order.
        var sent: [String: [DispatcherMessage]] = [:]
        /// Everything else the machine asked for that is not a write, in order.
        var notes: [Machine.Action] = []
        /// Writes held back (`holdWrites`), to be finished by `flush`.
        var pending: [Machine.Action] = []
        var holdWrites = false
        var lost: [Machine.RequeueCause] = []

        init(proFirst: Bool = true, heartbeat: Duration = .seconds(1), maxRecording: Int = 4096, catalog: EffectCatalog = EffectCatalog(),
             providerLimits: [String: Int] = [:], lostWorkerGrace: Duration = .seconds(30)) {
            machine = Machine(catalog: catalog, configuration: .init(
                heartbeat: heartbeat, proFirst: proFirst, maxRecording: maxRecording, providerLimits: providerLimits, lostWorkerGrace: lostWorkerGrace
            ))
        }

        mutating func advance(_ duration: Duration) {
            now = now.advanced(by: duration)
            date = date.addingTimeInterval(Double(duration.wholeMilliseconds) / 1000)
        }

        mutating func create(_ id: String, user: String = "u", pro: Bool = false, effect: String = "copy") {
            rows[id] = JobRecord(
                id: id, userId: user, isPro: pro, imageKey: "uploads/\(user)/a.jpg", effectId: effect, parameters: [:], prompt: nil,
                status: .queued, progress: 0, attempts: 0, maxAttempts: retry.maxAttempts, lastError: nil, resultKey: nil,
                thumbnailKey: nil, createdAt: date, updatedAt: date, startedAt: nil, finishedAt: nil, version: 1
            )
            run(machine.enqueue([Machine.queued(rows[id]!)], now: now))
        }

        mutating func ready(_ peer: String, capacity: Int = 1, effects: [String] = ["*"], heartbeatMs: Int? = nil, prefetch: Int? = nil) {
            let ready = WorkerReady(workerId: peer, capacity: capacity, effects: effects, heartbeatMilliseconds: heartbeatMs, prefetch: prefetch)
            run(machine.receive(.ready(ready), from: peer, now: now))
        }

        mutating func from(_ peer: String, _ message: WorkerMessage) {
            run(machine.receive(message, from: peer, now: now))
        }

        mutating func tick() { run(machine.tick(now: now)) }

        mutating func cancel(_ id: String) {
            guard let row = rows[id] else { return }
            switch JobRules.cancel(row, now: date) {
            case .apply(let transition): rows[id] = transition.job
            case .mark(let marked): rows[id] = marked
            case .unchanged, .alreadyFinished: return
            }
            run(machine.cancel(jobId: id, userId: row.userId))
        }

        mutating func reconcile() {
            let processing = rows.values.filter { $0.status == .processing }.map { JobAttempt(jobId: $0.id, attempt: $0.attempts) }
            run(machine.reconcile(processing: processing, now: now))
        }

        /// Finishes the writes held back, in order.
        mutating func flush() {
            let writes = pending
            pending = []
            for write in writes { carryOut(write) }
        }

        mutating func run(_ actions: [Machine.Action]) {
            for action in actions {
                switch action {
                case .send(let peer, let message): sent[peer, default: []].append(message)
                case .start, .record, .requeue, .lookUp, .recordSubmission:
                    if holdWrites { pending.append(action) } else { carryOut(action) }
                default: notes.append(action)
                }
            }
        }

        mutating func carryOut(_ write: Machine.Action) {
            switch write {
            case .start(let starts):
                var outcomes: [(Machine.Start, Machine.StartOutcome)] = []
                for start in starts {
                    guard let row = rows[start.job.jobId], let transition = JobRules.start(row, now: date) else {
                        outcomes.append((start, .gone))
                        continue
                    }
                    rows[row.id] = transition.job
                    outcomes.append((start, .started(transition.job)))
                }
                run(machine.started(outcomes, now: now))
            case .record(let peer, let attempt, let result):
                guard let row = rows[attempt.jobId] else {
                    run(machine.recorded(attempt, from: peer, outcome: .refused("no such job"), now: now))
                    return
                }
                run(machine.recorded(attempt, from: peer, outcome: outcome(of: JobRules.report(row, attempt, result, retry: retry, now: date)), now: now))
            case .requeue(let attempt, let reason, let cause):
                guard let row = rows[attempt.jobId] else { return }
                if case .apply(let transition) = JobRules.requeue(row, attempt, reason: reason, retry: retry, now: date) {
                    rows[row.id] = transition.job
                    lost.append(cause)
                    run(machine.requeued(transition.job, now: now))
                } else {
                    run(machine.requeued(nil, now: now))
                }
            case .recordSubmission(let peer, let attempt, let request):
                let outcome: Machine.SubmissionOutcome
                switch rows[attempt.jobId].map({ JobRules.submitted($0, attempt, request) }) {
                case .apply(let transition):
                    rows[attempt.jobId] = transition.job
                    outcome = .recorded
                case .alreadyRecorded: outcome = .recorded
                case .refuse(let reason): outcome = .refused(reason)
                case nil: outcome = .refused("no such job")
                }
                run(machine.submissionRecorded(attempt, from: peer, outcome: outcome, now: now))
            case .lookUp(let peer, let attempts):
                let current = attempts.filter { rows[$0.jobId]?.status == .processing && rows[$0.jobId]?.attempts == $0.attempt }
                run(machine.claimed(current, by: peer, now: now))
            default:
                break
            }
        }

        mutating func outcome(of decision: JobRules.Decision) -> Machine.RecordOutcome {
            switch decision {
            case .apply(let transition):
                rows[transition.job.id] = transition.job
                return .applied(transition.job, retryAfter: transition.retryAfter)
            case .alreadyRecorded: return .alreadyRecorded
            case .refuse(let reason): return .refused(reason)
            }
        }

        /// The attempts assigned to a worker so far, in order; `take` forgets them.
        func assigned(_ peer: String) -> [JobAttempt] {
            (sent[peer] ?? []).compactMap { if case .assign(let assignment) = $0 { assignment.attempt } else { nil } }
        }

        func messages(_ peer: String) -> [DispatcherMessage] {
            (sent[peer] ?? []).filter { $0 != .heartbeat }
        }

        mutating func clear() {
            sent = [:]
            notes = []
        }
    }

    func done(_ id: String, _ attempt: Int, key: String = "r") -> WorkerMessage {
        .done(JobAttempt(jobId: id, attempt: attempt), JobOutput(resultKey: "\(key)-\(id)", thumbnailKey: "t-\(id)"))
    }

    @Test func aFinishedJobsSlotGoesToTheNextJobInTheSameWriteAsItsResultAndOnlyOnce() {
        var harness = Harness()
        for id in ["j1", "j2", "j3"] { harness.create(id) }
        harness.ready("w", capacity: 1)
        #expect(harness.assigned("w") == [JobAttempt(jobId: "j1", attempt: 1)])
        // When the worker reports j1 done, its result and the start of the next job in its slot
        // come out of the one event (the owner writes them in one transaction)
        harness.holdWrites = true
        harness.from("w", done("j1", 1))
        let writes = harness.pending
        harness.pending = []
        #expect(writes.count == 2)
        guard case .record(_, let recorded, _) = writes.first, case .start(let starts) = writes.last else {
            Issue.record("expected a record and a start, got \(writes)")
            return
        }
        #expect(recorded == JobAttempt(jobId: "j1", attempt: 1) && starts.map(\.job.jobId) == ["j2"])
        // When the start is written and the result's write fails, the worker has j2, and j1's slot
        // counts as taken again: its result sent again starts no third job
        harness.holdWrites = false
        harness.carryOut(writes[1])
        #expect(harness.assigned("w").map(\.jobId) == ["j1", "j2"])
        harness.run(harness.machine.recorded(recorded, from: "w", outcome: .failed, now: harness.now))
        harness.holdWrites = true
        harness.from("w", done("j1", 1))
        #expect(harness.pending.count == 1)
        harness.holdWrites = false
        harness.flush()
        #expect(harness.rows["j1"]?.status == .completed && harness.rows["j3"]?.status == .queued)
        // And j2's end starts j3
        harness.from("w", done("j2", 1))
        #expect(harness.assigned("w").map(\.jobId) == ["j1", "j2", "j3"])
    }

    @Test func aWorkerThatAnnouncesBatchesIsToldSoAndItsMessagesInOneAreEachHandled() {
        var harness = Harness()
        for index in 0..<3 { harness.create("j\(index)") }
        // An older worker (no `batches`) is not told, and takes no batches
        harness.ready("old", capacity: 1)
        #expect(!harness.messages("old").contains(.batches) && !harness.machine.takesBatches("old"))
        // One that announces them is told so before its first assignment
        harness.run(harness.machine.receive(.ready(WorkerReady(workerId: "new", capacity: 2, effects: ["*"], batches: true)), from: "new", now: harness.now))
        #expect(harness.messages("new").first == .batches && harness.machine.takesBatches("new"))
        let held = harness.assigned("new")
        #expect(held.count == 2)
        // Its results in one message are each recorded and acknowledged; a nested `all` is ignored
        harness.from("new", .all(held.map { done($0.jobId, $0.attempt) } + [.all([done("j0", 1)])]))
        #expect(held.allSatisfy { harness.rows[$0.jobId]?.status == .completed })
        #expect(harness.rows["j0"]?.status == .processing)
        let acknowledged = harness.messages("new").compactMap { if case .recorded(let attempt) = $0 { attempt } else { nil } }
        #expect(Set(acknowledged) == Set(held))
    }

    // MARK: Generations at providers

    static let models = EffectCatalog(extra: [
        EffectDescription(id: "veo", title: "Veo", processor: "fal", credits: 4, kind: .video, model: "fal-ai/veo3.1/image-to-video"),
        EffectDescription(id: "banana", title: "Nano Banana", processor: "gemini", model: "gemini-2.5-flash-image"),
    ])

    static func request(_ id: String) -> ProviderRequest {
        ProviderRequest(provider: "fal", requestId: "r-\(id)", statusURL: "http://fal/\(id)/status", responseURL: "http://fal/\(id)",
                        cancelURL: "http://fal/\(id)/cancel", submittedAt: Date(timeIntervalSince1970: 1_800_000_000))
    }

    @Test func aGenerationWaitingAtItsProviderGivesItsSlotBackOnceItsRequestIsDurable() {
        var harness = Harness(catalog: Self.models)
        let video = JobAttempt(jobId: "v1", attempt: 1)
        harness.create("v1", effect: "veo")
        harness.create("j2")
        harness.ready("w", capacity: 1)
        #expect(harness.assigned("w") == [video])
        // Submitted, not yet durable: the slot is still the video's
        harness.holdWrites = true
        harness.from("w", .submitted(video, Self.request("v1")))
        #expect(harness.assigned("w") == [video])
        // Durable: the worker hears it, and its one slot takes the next job
        harness.holdWrites = false
        harness.flush()
        #expect(harness.rows["v1"]?.submission == Self.request("v1") && harness.rows["v1"]?.status == .processing)
        #expect(harness.messages("w").contains(.submissionRecorded(video)))
        #expect(harness.assigned("w") == [video, JobAttempt(jobId: "j2", attempt: 1)])
        #expect(harness.machine.awaitingCount == 1)
        // The same submission again (the worker resends until it hears) writes nothing new
        harness.from("w", .submitted(video, Self.request("v1")))
        #expect(harness.assigned("w").count == 2)
        // The provider's webhook pokes the worker that waits on it
        harness.clear()
        harness.run(harness.machine.poke(jobId: "v1"))
        #expect(harness.messages("w") == [.poke(video)])
        // Its result is recorded as any other; progress reports still count
        harness.from("w", .progress(video, fraction: 0.5))
        #expect(harness.machine.progress(of: ["v1"])["v1"] == 0.5)
        harness.from("w", done("v1", 1))
        #expect(harness.rows["v1"]?.status == .completed && harness.machine.awaitingCount == 0)
    }

    @Test func aLostWorkersGenerationWaitsForItThenIsQueuedAgainAndTheNextAttemptWaitsOnTheSameRequest() {
        var harness = Harness(catalog: Self.models)
        harness.create("v1", effect: "veo")
        harness.ready("w", capacity: 1)
        harness.from("w", .submitted(JobAttempt(jobId: "v1", attempt: 1), Self.request("v1")))
        // The worker goes silent: its generation waits for it the grace period, still processing
        harness.advance(.seconds(4))
        harness.tick()
        #expect(harness.lost.isEmpty && harness.rows["v1"]?.status == .processing && harness.machine.strandedCount == 1)
        #expect(harness.notes.contains { if case .workerLost("w", 1, 0) = $0 { true } else { false } })
        harness.advance(.seconds(25))
        harness.tick()
        harness.reconcile()
        #expect(harness.lost.isEmpty)
        // Past it (30 s after it was lost), the job is queued again with its provider request
        harness.advance(.seconds(6))
        harness.tick()
        #expect(harness.lost == [.workerLost] && harness.machine.strandedCount == 0)
        #expect(harness.rows["v1"]?.status == .queued && harness.rows["v1"]?.submission == Self.request("v1"))
        // The next worker's assignment names the request: nothing is submitted twice
        harness.ready("v", capacity: 1)
        let assignment = harness.sent["v"]?.compactMap { if case .assign(let job) = $0 { job } else { nil } }.first
        #expect(assignment?.attempt == JobAttempt(jobId: "v1", attempt: 2) && assignment?.submission == Self.request("v1"))
        // A submission from a stale attempt is refused and its worker told to stop
        harness.clear()
        harness.ready("w", capacity: 1)
        harness.from("v", .submitted(JobAttempt(jobId: "v1", attempt: 1), Self.request("v1")))
        #expect(harness.messages("v").isEmpty)
    }

    @Test func aWorkerBackWithinTheGraceHoldsItsModelCallAgainWhileItsLocalJobRunsElsewhere() {
        var harness = Harness(catalog: Self.models, providerLimits: ["gemini": 1])
        // Given a worker running a model call and a local filter, and a second model job queued
        harness.create("b1", effect: "banana")
        harness.create("c1")
        harness.create("b2", effect: "banana")
        harness.ready("w", capacity: 3)
        #expect(harness.assigned("w") == [JobAttempt(jobId: "b1", attempt: 1), JobAttempt(jobId: "c1", attempt: 1)])
        // When its link to jobs is cut past three heartbeats
        harness.advance(.seconds(4))
        harness.tick()
        // Then the filter is queued again at once; the model call waits, still counting at its
        // provider (b2 does not take its place), and no repair queues it meanwhile
        #expect(harness.lost == [.workerLost] && harness.rows["c1"]?.status == .queued)
        #expect(harness.rows["b1"]?.status == .processing && harness.machine.activeByProvider() == ["gemini": 1])
        harness.advance(.seconds(5))
        harness.reconcile()
        harness.advance(.seconds(5))
        harness.reconcile()
        #expect(harness.lost == [.workerLost])
        // And when the worker comes back and names it, it holds it again: the same attempt
        // completes, the model called once
        harness.ready("w-again", capacity: 3)
        harness.from("w-again", .heartbeat(running: [JobAttempt(jobId: "b1", attempt: 1)]))
        #expect(harness.machine.holder(of: "b1")?.peer == "w-again" && harness.machine.strandedCount == 0)
        harness.from("w-again", done("b1", 1))
        #expect(harness.rows["b1"]?.status == .completed && harness.rows["b1"]?.attempts == 1)
        #expect(harness.assigned("w-again").contains(JobAttempt(jobId: "b2", attempt: 1)))
    }

    /// A model call ("b1", Gemini) whose worker "w" fell silent past its deadline: the tick that
    /// found it lost is done.
    static func modelCallOfALostWorker(grace: Duration = .seconds(30)) -> Harness {
        var harness = Harness(catalog: models, lostWorkerGrace: grace)
        harness.create("b1", effect: "banana")
        harness.ready("w", capacity: 1)
        harness.advance(.seconds(4))
        harness.tick()
        return harness
    }

    @Test func aGenerationCancelledWhileItsWorkerIsAwayIsNotTakenBackNorQueuedAgain() {
        var harness = Self.modelCallOfALostWorker()
        harness.cancel("b1")
        #expect(harness.machine.strandedCount == 0 && harness.rows["b1"]?.status == .cancelled && harness.lost == [.workerLost])
        harness.ready("w-again", capacity: 1)
        harness.from("w-again", .heartbeat(running: [JobAttempt(jobId: "b1", attempt: 1)]))
        harness.advance(.seconds(40))
        harness.tick()
        #expect(harness.machine.holder(of: "b1") == nil && harness.lost == [.workerLost])
    }

    @Test func aWorkerThatComesBackUnderItsIdWithoutItsModelCallHasItQueuedAgainAtOnce() {
        var harness = Self.modelCallOfALostWorker()
        #expect(harness.lost.isEmpty && harness.machine.strandedCount == 1)
        // It restarted: the same id, holding nothing
        harness.ready("w", capacity: 1)
        harness.from("w", .heartbeat(running: []))
        #expect(harness.lost == [.workerLost] && harness.machine.strandedCount == 0)
        #expect(harness.assigned("w").last == JobAttempt(jobId: "b1", attempt: 2))
    }

    @Test func withNoGraceALostWorkersModelCallIsQueuedAgainAtOnce() {
        let harness = Self.modelCallOfALostWorker(grace: .zero)
        #expect(harness.lost == [.workerLost] && harness.rows["b1"]?.status == .queued)
    }

    @Test func aProvidersLimitKeepsItsJobsInTheQueueNotInAWorker() {
        var harness = Harness(catalog: Self.models, providerLimits: ["gemini": 1])
        harness.create("b1", effect: "banana")
        harness.create("b2", effect: "banana")
        harness.create("c3")
        harness.ready("w", capacity: 3)
        // One gemini job at a time; the filter behind them is not held up
        #expect(harness.assigned("w") == [JobAttempt(jobId: "b1", attempt: 1), JobAttempt(jobId: "c3", attempt: 1)])
        #expect(harness.machine.activeByProvider() == ["gemini": 1])
        harness.from("w", done("b1", 1))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "b2", attempt: 1))
    }

    @Test func aJobWhoseModelAnsweredGivesItsSlotAndItsProviderPlaceToTheNext() {
        var harness = Harness(catalog: Self.models, providerLimits: ["gemini": 1])
        for index in 1...3 { harness.create("b\(index)", effect: "banana") }
        harness.ready("w", capacity: 1)
        #expect(harness.assigned("w") == [JobAttempt(jobId: "b1", attempt: 1)])
        // A stale attempt's answer, or one for a job the worker does not hold, changes nothing
        harness.from("w", .answered(JobAttempt(jobId: "b1", attempt: 2)))
        harness.from("w", .answered(JobAttempt(jobId: "b3", attempt: 1)))
        #expect(harness.assigned("w").count == 1)
        // When b1's model answered, b2 takes the slot and the provider's one place at once
        harness.from("w", .answered(JobAttempt(jobId: "b1", attempt: 1)))
        #expect(harness.assigned("w") == [JobAttempt(jobId: "b1", attempt: 1), JobAttempt(jobId: "b2", attempt: 1)])
        #expect(harness.machine.activeByProvider() == ["gemini": 1])
        // The same answer again hands out nothing more
        harness.from("w", .answered(JobAttempt(jobId: "b1", attempt: 1)))
        #expect(harness.assigned("w").count == 2)
        // And b1's result is recorded as any other, which frees no second slot
        harness.from("w", done("b1", 1))
        #expect(harness.rows["b1"]?.status == .completed && harness.messages("w").contains(.recorded(JobAttempt(jobId: "b1", attempt: 1))))
        #expect(harness.assigned("w").count == 2 && harness.machine.queuedCount == 1)
        harness.from("w", done("b2", 1))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "b3", attempt: 1))
    }

    // MARK: Assignment

    @Test func aWorkerGetsUpToItsCapacityAndTheNextJobWhenOneIsRecorded() {
        var harness = Harness()
        for index in 1...3 { harness.create("j\(index)") }
        #expect(harness.machine.queuedCount == 3)
        // Given a worker that runs two at once
        harness.ready("w", capacity: 2)
        // Then it is assigned two jobs, as attempt 1, and one stays queued
        #expect(harness.assigned("w") == [JobAttempt(jobId: "j1", attempt: 1), JobAttempt(jobId: "j2", attempt: 1)])
        #expect(harness.rows["j1"]?.status == .processing && harness.rows["j3"]?.status == .queued)
        #expect(harness.machine.queuedCount == 1)
        // When it reports j1 done, it hears `recorded`, then gets j3
        harness.clear()
        harness.from("w", done("j1", 1))
        // (exactly two messages, in this order: the record of j1, then j3's assignment)
        let messages = harness.messages("w")
        #expect(messages.count == 2 && messages.first == .recorded(JobAttempt(jobId: "j1", attempt: 1)))
        if messages.count == 2, case .assign(let assignment) = messages[1] {
            #expect(assignment.attempt == JobAttempt(jobId: "j3", attempt: 1))
        } else {
            Issue.record("the second message is not j3's assignment: \(messages)")
        }
        #expect(harness.rows["j1"]?.status == .completed)
        #expect(harness.notes.contains { if case .finished(let job, _) = $0 { job.id == "j1" } else { false } })
    }

    @Test func freshURLsAreSignedOnlyForAnAttemptTheAskingWorkerHolds() {
        var harness = Harness()
        harness.create("j1")
        harness.ready("w", capacity: 1)
        harness.ready("v", capacity: 1)
        harness.clear()
        // The holder of j1's first attempt asks: its URLs are signed again
        harness.from("w", .renew(JobAttempt(jobId: "j1", attempt: 1)))
        #expect(harness.notes.contains { if case .renew("w", JobAttempt(jobId: "j1", attempt: 1)) = $0 { true } else { false } })
        // Another worker, or a stale attempt number: nothing
        harness.clear()
        harness.from("v", .renew(JobAttempt(jobId: "j1", attempt: 1)))
        harness.from("w", .renew(JobAttempt(jobId: "j1", attempt: 2)))
        #expect(!harness.notes.contains { if case .renew = $0 { true } else { false } })
    }

    @Test func aWorkerThatPrefetchesHoldsItsCapacityAndItsPrefetch() {
        var harness = Harness()
        for index in 1...4 { harness.create("j\(index)") }
        harness.ready("w", capacity: 1, prefetch: 1)
        #expect(harness.assigned("w").map(\.jobId) == ["j1", "j2"])
        harness.from("w", done("j1", 1))
        #expect(harness.assigned("w").map(\.jobId) == ["j1", "j2", "j3"])
        // A negative prefetch counts as none
        harness.ready("v", capacity: 1, prefetch: -5)
        #expect(harness.assigned("v").map(\.jobId) == ["j4"])
        harness.create("j5")
        #expect(harness.assigned("v").count == 1 && harness.machine.queuedCount == 1)
    }

    @Test func aLeavingWorkerGetsNoMoreJobsGivesBackItsPrefetchedOnesAndFinishesTheRest() {
        var harness = Harness()
        for index in 1...3 { harness.create("j\(index)") }
        harness.ready("w", capacity: 1, prefetch: 1)
        #expect(harness.assigned("w").map(\.jobId) == ["j1", "j2"])
        // When it says it is stopping, giving back j2 which it has not started
        harness.from("w", .leaving(returned: [JobAttempt(jobId: "j2", attempt: 1)]))
        // Then j2 is queued again at once, the worker hears that nothing more comes, and nothing does
        #expect(harness.lost == [.returned])
        #expect(harness.messages("w").last == .leaveNoted)
        #expect(harness.rows["j2"]?.status == .queued && harness.rows["j2"]?.lastError?.contains("stopped before running it") == true)
        #expect(harness.assigned("w").count == 2 && harness.machine.queuedCount == 2)
        // And the job it runs is still recorded when it ends, and still nothing more goes to it
        harness.from("w", done("j1", 1))
        #expect(harness.rows["j1"]?.status == .completed && harness.messages("w").contains(.recorded(JobAttempt(jobId: "j1", attempt: 1))))
        #expect(harness.assigned("w").count == 2)
        // A give-back of an attempt it does not hold changes nothing; another worker takes the rest
        harness.from("w", .leaving(returned: [JobAttempt(jobId: "j3", attempt: 1)]))
        #expect(harness.lost == [.returned])
        harness.ready("v", capacity: 2)
        #expect(harness.assigned("v").map(\.jobId) == ["j2", "j3"])
        #expect(harness.assigned("v").first?.attempt == 2)
        // And once it goes quiet, holding nothing, it has left: not lost
        harness.advance(.seconds(4))
        harness.from("v", .heartbeat(running: [JobAttempt(jobId: "j2", attempt: 2), JobAttempt(jobId: "j3", attempt: 1)]))
        harness.tick()
        #expect(harness.notes.contains { if case .workerLeft("w", 1) = $0 { true } else { false } })
        #expect(!harness.notes.contains { if case .workerLost = $0 { true } else { false } })
    }

    @Test func aStartWrittenWhileItsWorkerLeavesIsQueuedAgainNotSentAfterTheWorkerHeardNothingMoreComes() {
        var harness = Harness()
        harness.holdWrites = true
        for index in 1...2 { harness.create("j\(index)") }
        harness.ready("w", capacity: 1, prefetch: 1)
        #expect(harness.pending.count == 1)
        // When the worker says it is stopping while the starts of its two jobs are being written
        harness.from("w", .leaving(returned: []))
        #expect(harness.messages("w") == [.leaveNoted])
        harness.holdWrites = false
        harness.flush()
        // Then neither goes to it: both are queued again, as given back, for the next worker
        #expect(harness.messages("w") == [.leaveNoted])
        #expect(harness.lost == [.returned, .returned])
        #expect(harness.rows["j1"]?.status == .queued && harness.rows["j2"]?.status == .queued)
        harness.ready("v", capacity: 2)
        #expect(Set(harness.assigned("v").map(\.jobId)) == ["j1", "j2"])
    }

    @Test func theWritesOfJobsHandedOutTogetherGoInOneAction() {
        var harness = Harness()
        harness.holdWrites = true
        for index in 1...8 { harness.create("j\(index)") }
        harness.ready("w", capacity: 8)
        // Then one start action carries all eight, and nothing is assigned before it is written
        #expect(harness.pending.count == 1)
        if case .start(let starts) = harness.pending.first { #expect(starts.count == 8) } else { Issue.record("no start action") }
        #expect(harness.assigned("w").isEmpty)
        harness.flush()
        #expect(harness.assigned("w").count == 8)
    }

    @Test func aStartThatCannotBeWrittenIsTriedAgainAtTheNextTickNotAtOnce() {
        var harness = Harness()
        harness.create("j")
        harness.holdWrites = true
        harness.ready("w")
        guard case .start(let starts) = harness.pending.first else {
            Issue.record("no start")
            return
        }
        harness.pending = []
        // When the write fails, the job is queued again and nothing is started at once
        harness.run(harness.machine.started(starts.map { ($0, .failed) }, now: harness.now))
        #expect(harness.pending.isEmpty && harness.machine.queuedCount == 1)
        // Then the next tick tries again
        harness.advance(.milliseconds(200))
        harness.tick()
        #expect(harness.pending.count == 1)
    }

    @Test func pausedEffectsAndProvidersKeepTheirJobsQueuedUntilResumedLosingNone() {
        var harness = Harness(catalog: Self.models)
        harness.run(harness.machine.apply(DispatchControls(pausedEffects: ["blur"], pausedProviders: ["gemini"]), now: harness.now))
        harness.create("b1", effect: "banana")
        harness.create("blur1", effect: "blur")
        harness.create("c1")
        harness.ready("w", capacity: 5)
        // Only the job of neither the paused effect nor the paused provider goes out
        #expect(harness.assigned("w") == [JobAttempt(jobId: "c1", attempt: 1)])
        #expect(harness.machine.queuedCount == 2)
        // Resuming the provider hands its job out at once; the paused effect's stays
        harness.run(harness.machine.apply(DispatchControls(pausedEffects: ["blur"]), now: harness.now))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "b1", attempt: 1))
        #expect(harness.machine.queuedCount == 1)
        harness.run(harness.machine.apply(DispatchControls(), now: harness.now))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "blur1", attempt: 1))
        #expect(harness.machine.queuedCount == 0)
    }

    @Test func aProvidersConcurrencySetLiveOverridesTheConfiguredOneAndGoesBackToIt() {
        var harness = Harness(catalog: Self.models, providerLimits: ["gemini": 1])
        for index in 1...3 { harness.create("b\(index)", effect: "banana") }
        harness.ready("w", capacity: 5)
        #expect(harness.assigned("w").count == 1)
        // Raised live: two more go out at once
        harness.run(harness.machine.apply(DispatchControls(providerLimits: ["gemini": 3]), now: harness.now))
        #expect(harness.assigned("w").count == 3 && harness.machine.providerLimits == ["gemini": 3])
        // Back to the configured limit: nothing taken back, nothing more handed out
        harness.run(harness.machine.apply(DispatchControls(), now: harness.now))
        #expect(harness.machine.providerLimits == ["gemini": 1] && harness.machine.activeByProvider() == ["gemini": 3])
    }

    @Test func aDrainedWorkerFinishesWhatItHoldsGetsNothingNewEvenAfterReconnectingAndIsUndrained() {
        var harness = Harness()
        harness.ready("w", capacity: 1)
        harness.create("a")
        #expect(harness.assigned("w") == [JobAttempt(jobId: "a", attempt: 1)])
        harness.run(harness.machine.apply(DispatchControls(drainedWorkers: ["w"]), now: harness.now))
        harness.create("b")
        harness.from("w", done("a", 1))
        harness.flush()
        // Its result is taken; its free slot is not used
        #expect(harness.rows["a"]?.status == .completed && harness.assigned("w").count == 1)
        #expect(harness.machine.workerViews(now: harness.now).first?.drained == true)
        // A reconnect (ready again) keeps it drained
        harness.ready("w", capacity: 1)
        #expect(harness.assigned("w").count == 1)
        harness.run(harness.machine.apply(DispatchControls(), now: harness.now))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "b", attempt: 1))
    }

    @Test func theWorkersViewSaysWhatEachAnnouncedAndHolds() {
        var harness = Harness()
        harness.run(harness.machine.receive(.ready(WorkerReady(workerId: "gpu-1", capacity: 2, effects: ["copy", "blur"], prefetch: 1, host: "gpu-host-7", version: "0.1.0")),
                                            from: "gpu-1", now: harness.now))
        harness.create("a")
        harness.advance(.milliseconds(500))
        let view = harness.machine.workerViews(now: harness.now)
        #expect(view.count == 1)
        #expect(view.first?.host == "gpu-host-7" && view.first?.version == "0.1.0" && view.first?.capacity == 2 && view.first?.prefetch == 1)
        #expect(view.first?.effects == ["blur", "copy"] && view.first?.running == 1 && view.first?.silentFor == .milliseconds(500))
    }

    @Test func aJobGoesOnlyToAWorkerThatRunsItsEffect() {
        var harness = Harness()
        harness.ready("blur-only", effects: ["blur"])
        harness.create("c", effect: "copy")
        #expect(harness.assigned("blur-only").isEmpty)
        harness.create("b", effect: "blur")
        #expect(harness.assigned("blur-only") == [JobAttempt(jobId: "b", attempt: 1)])
        harness.ready("any")
        #expect(harness.assigned("any") == [JobAttempt(jobId: "c", attempt: 1)])
    }

    @Test func theWorkerWithTheMostFreeSlotsIsServedFirst() {
        var harness = Harness()
        harness.ready("small", capacity: 1)
        harness.ready("big", capacity: 4)
        for index in 1...4 { harness.create("j\(index)") }
        // Each job goes to the freest worker: big (4 free), big (3), big (2), then either
        #expect(harness.assigned("big").count >= 3)
        #expect(harness.assigned("big").count + harness.assigned("small").count == 4)
    }

    @Test func aWorkerAnnouncingNonsenseIsClamped() {
        var harness = Harness()
        harness.ready("w", capacity: 100_000, heartbeatMs: 1)
        harness.ready("v", capacity: -3, heartbeatMs: 10_000_000)
        let joined = harness.notes.compactMap { if case .workerJoined(let id, let capacity, let heartbeat, _) = $0 { (id, capacity, heartbeat) } else { nil } }
        #expect(joined.count == 2)
        #expect(joined[0].0 == "w" && joined[0].1 == 256 && joined[0].2 == .milliseconds(50))
        #expect(joined[1].0 == "v" && joined[1].1 == 1 && joined[1].2 == .seconds(60))
    }

    // MARK: Fairness

    @Test func oneUsersBurstDoesNotStarveAnother() {
        var harness = Harness()
        for index in 0..<10 { harness.create("a\(index)", user: "A") }
        harness.create("b0", user: "B")
        harness.ready("w")
        // One at a time: A's first, then B's, then A's in order
        var order: [String] = []
        for _ in 0..<11 {
            guard let next = harness.assigned("w").last else { break }
            order.append(next.jobId)
            harness.clear()
            harness.from("w", done(next.jobId, next.attempt))
        }
        #expect(order.count == 11)
        #expect(order.firstIndex(of: "b0") == 1)
        #expect(order.filter { $0.hasPrefix("a") } == (0..<10).map { "a\($0)" })
    }

    @Test func proJobsGoFirstUnlessTurnedOff() {
        for proFirst in [true, false] {
            var harness = Harness(proFirst: proFirst)
            harness.create("free", user: "F")
            harness.create("pro", user: "P", pro: true)
            harness.ready("w")
            #expect(harness.assigned("w").first?.jobId == (proFirst ? "pro" : "free"))
        }
    }

    // MARK: Fencing

    @Test func aStaleAttemptsResultIsRefusedAndFreesNothing() {
        var harness = Harness(heartbeat: .milliseconds(100))
        harness.create("j")
        harness.ready("old", heartbeatMs: 100)
        #expect(harness.assigned("old") == [JobAttempt(jobId: "j", attempt: 1)])
        // Given the first worker goes silent past three of its intervals and the job goes to
        // another worker as attempt 2
        harness.advance(.milliseconds(301))
        harness.ready("new", heartbeatMs: 100)
        harness.tick()
        #expect(harness.lost == [.workerLost])
        #expect(harness.assigned("new") == [JobAttempt(jobId: "j", attempt: 2)])
        // When attempt 1's late result comes (the old worker reconnected)
        harness.ready("old", heartbeatMs: 100)
        harness.from("old", done("j", 1, key: "stale"))
        // Then it is refused, attempt 2 keeps its worker, and its result is the one recorded
        #expect(harness.messages("old").contains { if case .refused(JobAttempt(jobId: "j", attempt: 1), _) = $0 { true } else { false } })
        #expect(harness.machine.holder(of: "j")?.peer == "new")
        harness.from("new", done("j", 2))
        #expect(harness.rows["j"]?.status == .completed && harness.rows["j"]?.resultKey == "r-j")
        // And a result sent again after it was recorded is acknowledged again
        harness.clear()
        harness.from("new", done("j", 2))
        #expect(harness.messages("new") == [.recorded(JobAttempt(jobId: "j", attempt: 2))])
    }

    @Test func aResultSentAgainWhileItIsBeingWrittenIsWrittenOnce() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.holdWrites = true
        harness.from("w", done("j", 1))
        harness.from("w", done("j", 1))
        #expect(harness.pending.count == 1)
        harness.flush()
        #expect(harness.messages("w").filter { $0 == .recorded(JobAttempt(jobId: "j", attempt: 1)) }.count == 1)
    }

    @Test func resultsBeingWrittenAreBounded() {
        var harness = Harness(maxRecording: 2)
        harness.holdWrites = true
        for index in 0..<5 { harness.from("w", done("nobody-\(index)", 1)) }
        // An unknown worker is told to reconnect; nothing is written for it
        #expect(harness.pending.isEmpty && harness.messages("w").allSatisfy { $0 == .reconnect })
        harness.ready("w")
        for index in 0..<5 { harness.from("w", done("nobody-\(index)", 1)) }
        // Past the bound, results are dropped for now (the worker sends them again)
        #expect(harness.pending.count == 2)
        harness.flush()
        #expect(harness.messages("w").filter { if case .refused = $0 { true } else { false } }.count == 2)
    }

    // MARK: Liveness

    @Test func aWorkerIsDeadAfterThreeOfItsOwnIntervalsNotTheServices() {
        var harness = Harness(heartbeat: .seconds(1))
        harness.create("j")
        harness.ready("slow", heartbeatMs: 5000)
        #expect(harness.assigned("slow").count == 1)
        // It heartbeats every 5 s while running a 10 s job: never dead
        for _ in 0..<2 {
            harness.advance(.seconds(5))
            harness.from("slow", .heartbeat(running: [JobAttempt(jobId: "j", attempt: 1)]))
            harness.tick()
        }
        #expect(harness.lost.isEmpty && harness.rows["j"]?.status == .processing)
        harness.from("slow", done("j", 1))
        #expect(harness.rows["j"]?.status == .completed)
        // Given it then goes silent with another job
        harness.create("k")
        harness.advance(.milliseconds(14_999))
        harness.tick()
        // Then at 14.999 s it is alive, and past 15 s (three of its 5 s intervals) it is dead
        #expect(harness.lost.isEmpty)
        harness.advance(.milliseconds(2))
        harness.tick()
        #expect(harness.lost == [.workerLost])
        #expect(harness.rows["k"]?.status == .queued && harness.rows["k"]?.attempts == 1)
        #expect(harness.notes.contains { if case .workerLost("slow", 1, 0) = $0 { true } else { false } })
        #expect(harness.machine.workerCount == 0)
        // And a message from it now tells it to reconnect
        harness.from("slow", .heartbeat(running: []))
        #expect(harness.messages("slow").last == .reconnect)
    }

    @Test func aFastWorkerIsDeadAfterThreeHundredMilliseconds() {
        var harness = Harness()
        harness.create("j")
        harness.ready("fast", heartbeatMs: 100)
        harness.advance(.milliseconds(299))
        harness.tick()
        #expect(harness.lost.isEmpty)
        harness.advance(.milliseconds(2))
        harness.tick()
        #expect(harness.lost == [.workerLost])
    }

    @Test func anAssignmentTheWorkerNeverNamesIsQueuedAgain() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w", heartbeatMs: 200)
        // Its heartbeats name nothing; within 600 ms (three intervals) that is not yet a loss
        for _ in 0..<3 {
            harness.advance(.milliseconds(200))
            harness.from("w", .heartbeat(running: []))
        }
        #expect(harness.lost.isEmpty)
        harness.advance(.milliseconds(1))
        harness.from("w", .heartbeat(running: []))
        // Then it is queued again and handed out again, to the same live worker, as attempt 2
        #expect(harness.lost == [.assignmentLost])
        #expect(harness.assigned("w") == [JobAttempt(jobId: "j", attempt: 1), JobAttempt(jobId: "j", attempt: 2)])
    }

    @Test func theServiceSendsHeartbeatsAtItsOwnPace() {
        var harness = Harness(heartbeat: .seconds(1))
        harness.ready("w", heartbeatMs: 100)
        harness.tick()
        #expect(harness.sent["w"]?.filter { $0 == .heartbeat }.count == 1)
        harness.advance(.milliseconds(900))
        harness.from("w", .heartbeat(running: []))
        harness.tick()
        #expect(harness.sent["w"]?.filter { $0 == .heartbeat }.count == 1)
        harness.advance(.milliseconds(100))
        harness.tick()
        #expect(harness.sent["w"]?.filter { $0 == .heartbeat }.count == 2)
    }

    @Test func afterARestartAWorkerGetsBackTheJobsItNames() {
        // Given the database says j is processing as attempt 1 (the service restarted)
        var harness = Harness()
        harness.create("j")
        harness.rows["j"] = JobRules.start(harness.rows["j"]!, now: harness.date)!.job
        harness.machine = Machine(catalog: EffectCatalog())
        harness.ready("w")
        // When the worker names it (and a stale attempt of it, and a job that is not there)
        harness.from("w", .heartbeat(running: [JobAttempt(jobId: "j", attempt: 1), JobAttempt(jobId: "gone", attempt: 1)]))
        // Then it holds j again: nothing requeues it, and its result is recorded
        #expect(harness.machine.holder(of: "j")?.peer == "w")
        #expect(harness.machine.holder(of: "gone") == nil)
        harness.advance(.seconds(10))
        harness.reconcile()
        harness.advance(.seconds(10))
        harness.reconcile()
        #expect(harness.lost.isEmpty)
        harness.from("w", done("j", 1))
        #expect(harness.rows["j"]?.status == .completed)
    }

    @Test func aProcessingJobNobodyHoldsIsQueuedAgainAfterTheGrace() {
        var harness = Harness(heartbeat: .seconds(1))
        harness.create("j")
        harness.rows["j"] = JobRules.start(harness.rows["j"]!, now: harness.date)!.job
        harness.machine = Machine(catalog: EffectCatalog())
        // A slow worker connected makes the grace three of its intervals (15 s), not 3 s
        harness.ready("slow", capacity: 1, heartbeatMs: 5000)
        #expect(harness.machine.grace == .seconds(15))
        harness.reconcile()
        harness.advance(.seconds(14))
        harness.from("slow", .heartbeat(running: []))
        harness.reconcile()
        #expect(harness.lost.isEmpty)
        harness.advance(.seconds(1))
        harness.reconcile()
        #expect(harness.lost == [.unheld])
        #expect(harness.assigned("slow") == [JobAttempt(jobId: "j", attempt: 2)])
    }

    // MARK: Retries

    @Test func retriesWaitOutTheirBackoff() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        // Attempt 1 fails retryably: queued again, but not handed out before 1 s
        harness.from("w", .failed(JobAttempt(jobId: "j", attempt: 1), error: "busy", retryable: true))
        #expect(harness.rows["j"]?.status == .queued && harness.machine.queuedCount == 1)
        harness.advance(.milliseconds(999))
        harness.tick()
        #expect(harness.assigned("w").count == 1)
        harness.advance(.milliseconds(1))
        harness.tick()
        #expect(harness.assigned("w").last == JobAttempt(jobId: "j", attempt: 2))
        // Attempt 2 fails: 2 s this time
        harness.from("w", .failed(JobAttempt(jobId: "j", attempt: 2), error: "busy", retryable: true))
        harness.advance(.milliseconds(1999))
        harness.tick()
        #expect(harness.assigned("w").count == 2)
        harness.advance(.milliseconds(1))
        harness.tick()
        #expect(harness.assigned("w").last == JobAttempt(jobId: "j", attempt: 3))
        // Attempt 3, the last, fails: failed for good, nothing queued
        harness.from("w", .failed(JobAttempt(jobId: "j", attempt: 3), error: "busy", retryable: true))
        #expect(harness.rows["j"]?.status == .failed && harness.machine.queuedCount == 0)
        harness.advance(.seconds(60))
        harness.tick()
        #expect(harness.assigned("w").count == 3)
    }

    @Test func otherJobsRunWhileOneWaitsOutItsBackoff() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.create("k")
        harness.from("w", .failed(JobAttempt(jobId: "j", attempt: 1), error: "busy", retryable: true))
        #expect(harness.assigned("w").last == JobAttempt(jobId: "k", attempt: 1))
    }

    // MARK: Cancel

    @Test func cancellingAQueuedJobDropsIt() {
        var harness = Harness()
        harness.create("j")
        harness.cancel("j")
        #expect(harness.machine.queuedCount == 0 && harness.rows["j"]?.status == .cancelled)
        harness.ready("w")
        #expect(harness.assigned("w").isEmpty)
    }

    @Test func cancellingAJobWhileItsStartIsWrittenSendsTheCancelAfterTheAssignment() {
        var harness = Harness()
        harness.create("j")
        harness.holdWrites = true
        harness.ready("w")
        // The start is committed, then the user cancels before the dispatcher hears of it
        if case .start(let starts) = harness.pending.first, let start = starts.first {
            harness.rows["j"] = JobRules.start(harness.rows[start.job.jobId]!, now: harness.date)!.job
        }
        harness.pending = []
        harness.cancel("j")
        #expect(harness.messages("w").isEmpty)
        harness.run(harness.machine.started([(Machine.Start(peer: "w", job: Machine.queued(harness.rows["j"]!)), .started(harness.rows["j"]!))], now: harness.now))
        #expect(harness.messages("w").count == 2)
        #expect(harness.messages("w").last == .cancel(JobAttempt(jobId: "j", attempt: 1)))
        // And the worker's `cancelled` ends it
        harness.holdWrites = false
        harness.from("w", .cancelled(JobAttempt(jobId: "j", attempt: 1)))
        #expect(harness.rows["j"]?.status == .cancelled)
    }

    @Test func cancellingARunningJobTellsItsWorker() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.cancel("j")
        #expect(harness.messages("w").last == .cancel(JobAttempt(jobId: "j", attempt: 1)))
        harness.from("w", .cancelled(JobAttempt(jobId: "j", attempt: 1)))
        #expect(harness.rows["j"]?.status == .cancelled)
        #expect(harness.machine.holder(of: "j") == nil)
    }

    @Test func aCancelledJobWaitingOutABackoffIsNotHandedOut() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.from("w", .failed(JobAttempt(jobId: "j", attempt: 1), error: "busy", retryable: true))
        harness.cancel("j")
        #expect(harness.machine.queuedCount == 0)
        harness.advance(.seconds(5))
        harness.tick()
        #expect(harness.assigned("w").count == 1 && harness.rows["j"]?.status == .cancelled)
    }

    @Test func aCancelOfAFinishedOrUnknownJobDoesNothing() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.from("w", done("j", 1))
        harness.clear()
        // The state machine itself is asked (the harness's `cancel` stops at the rules, which
        // refuse a finished job before the machine hears of it): a job it no longer holds, and
        // one it never knew, change nothing and tell no worker anything.
        harness.run(harness.machine.cancel(jobId: "j", userId: "u"))
        harness.run(harness.machine.cancel(jobId: "nope", userId: "u"))
        #expect(harness.messages("w").isEmpty && harness.rows["j"]?.status == .completed)
        #expect(harness.machine.holder(of: "j") == nil && harness.machine.queuedCount == 0)
    }

    @Test func aLostWorkersCancelledJobIsCancelledNotRetried() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w", heartbeatMs: 100)
        harness.cancel("j")
        harness.advance(.milliseconds(301))
        harness.tick()
        #expect(harness.rows["j"]?.status == .cancelled && harness.machine.queuedCount == 0)
    }

    // MARK: Progress

    @Test func progressIsKeptForTheCurrentAttemptOnly() {
        var harness = Harness()
        harness.create("j")
        harness.ready("w")
        harness.from("w", .progress(JobAttempt(jobId: "j", attempt: 1), fraction: 0.4))
        harness.from("w", .progress(JobAttempt(jobId: "j", attempt: 1), fraction: 0.2))
        harness.from("w", .progress(JobAttempt(jobId: "j", attempt: 7), fraction: 0.9))
        harness.from("w", .progress(JobAttempt(jobId: "j", attempt: 1), fraction: .nan))
        #expect(harness.machine.progress(of: ["j"]) == ["j": 0.4])
        harness.from("w", done("j", 1))
        #expect(harness.machine.progress(of: ["j"]).isEmpty)
    }
}
