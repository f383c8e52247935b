import Foundation
import Messages
import Testing
@testable import WorkerKit

/// The worker's state machine, driven by hand: messages, places asked, jobs ending and heartbeat
/// ticks at instants the test chooses. No sockets, no tasks, no sleeping.
@Suite("Worker state machine")
struct WorkerStateTests {
    static let start = ContinuousClock.now
    static let heartbeat = Duration.seconds(1)
    static let ready = WorkerMessage.ready(WorkerReady(
        workerId: "w", capacity: 2, effects: ["blur"], heartbeatMilliseconds: 1000, prefetch: 2, batches: true
    ))

    static func machine(capacity: Int = 2, maxDetached: Int = 10) -> WorkerState {
        var state = WorkerState(capacity: capacity, maxDetached: maxDetached, heartbeat: heartbeat, ready: ready, now: start)
        _ = state.connected(now: start)
        return state
    }

    static func attempt(_ id: String) -> JobAttempt { JobAttempt(jobId: id, attempt: 1) }

    static func assignment(_ id: String) -> JobAssignment {
        JobAssignment(attempt: attempt(id), userId: "u", imageKey: "originals/u/\(id).jpg",
                      effect: EffectDescription(id: "blur", title: "Blur", processor: "blur"), parameters: [:], prompt: nil)
    }

    /// `ids` assigned, in order.
    static func assign(_ state: inout WorkerState, _ ids: [String], at now: ContinuousClock.Instant = start) -> [WorkerState.Action] {
        ids.flatMap { state.received(.assign(assignment($0)), now: now) }.filter { if case .note = $0 { false } else { true } }
    }

    static func grants(_ actions: [WorkerState.Action]) -> [String] {
        actions.compactMap { if case .grant(let attempt) = $0 { attempt.jobId } else { nil } }
    }

    static func sends(_ actions: [WorkerState.Action]) -> [WorkerMessage] {
        actions.compactMap { if case .send(let message) = $0 { message } else { nil } }
    }

    @Test func placesGoInTheOrderJobsWereAssignedAtMostCapacityAtOnce() {
        var state = Self.machine(capacity: 2)
        #expect(Self.assign(&state, ["a", "b", "c"]) == ["a", "b", "c"].map { .launch(Self.assignment($0)) })
        // c's input is ready first: it waits, since a and b were assigned before it
        #expect(Self.grants(state.askPlace(Self.attempt("c"))).isEmpty)
        #expect(Self.grants(state.askPlace(Self.attempt("b"))).isEmpty)
        // a asks: a and b have the two places; c waits for one
        #expect(Self.grants(state.askPlace(Self.attempt("a"))) == ["a", "b"])
        #expect(state.place(of: Self.attempt("c")) == .asking)
        // a ends: its place goes to c
        let ended = state.ended(Self.attempt("a"), result: .done(Self.attempt("a"), JobOutput(resultKey: "r", thumbnailKey: "t")))
        #expect(Self.grants(ended) == ["c"])
        #expect(state.unrecorded.keys.contains(Self.attempt("a")))
        // A job that has its place and asks again (its work tried again) goes on at once
        #expect(state.askPlace(Self.attempt("b")) == [.grant(Self.attempt("b"))])
    }

    @Test func aGenerationWaitingOnItsProviderGivesItsPlaceBackUpToTheLimit() {
        var state = Self.machine(capacity: 1, maxDetached: 1)
        _ = Self.assign(&state, ["v1", "v2", "v3"])
        for id in ["v1", "v2", "v3"] { _ = state.askPlace(Self.attempt(id)) }
        #expect(state.place(of: Self.attempt("v1")) == .placed)
        // v1 submitted to the provider: its place goes to v2
        let (detached, actions) = state.detach(Self.attempt("v1"))
        #expect(detached && Self.grants(actions) == ["v2"])
        // v2 submitted too, but one generation waits already: it keeps its place
        #expect(state.detach(Self.attempt("v2")).0 == false)
        #expect(state.place(of: Self.attempt("v3")) == .asking)
        // An image model answered for v2: it finishes without its place, which goes to v3
        let (released, next) = state.release(Self.attempt("v2"))
        #expect(released && Self.grants(next) == ["v3"])
        #expect(state.release(Self.attempt("v2")).0 == false, "once per job")
    }

    @Test func aCancelStopsTheJobAndSaysWhetherItHadStarted() {
        var state = Self.machine()
        _ = Self.assign(&state, ["running", "waiting"])
        _ = state.askPlace(Self.attempt("running"))
        let running = state.received(.cancel(Self.attempt("running")), now: Self.start)
        #expect(running == [.note(.cancelling(Self.attempt("running"))), .stop(Self.attempt("running"))])
        #expect(state.received(.cancel(Self.attempt("waiting")), now: Self.start)
            == [.note(.cancelledBeforeStart(Self.attempt("waiting"))), .stop(Self.attempt("waiting"))])
        #expect(state.wasCancelled(Self.attempt("running")) && state.wasCancelled(Self.attempt("waiting")))
        #expect(state.received(.cancel(Self.attempt("unknown")), now: Self.start).isEmpty)
    }

    @Test func leavingGivesBackWhatHasNoPlaceFinishesTheRestAndEndsOnceRecordedAndNoted() {
        var state = Self.machine(capacity: 1)
        _ = Self.assign(&state, ["run", "video", "asking", "prefetched"])
        _ = state.askPlace(Self.attempt("video"))
        #expect(state.place(of: Self.attempt("video")) == .asking)
        _ = state.askPlace(Self.attempt("run"))
        // run was assigned first: it has the one place, video asks after it
        #expect(state.place(of: Self.attempt("run")) == .placed)
        _ = state.ended(Self.attempt("run"), result: nil)
        #expect(state.place(of: Self.attempt("video")) == .placed)
        _ = state.detach(Self.attempt("video"))
        _ = Self.assign(&state, ["run2"])
        _ = state.askPlace(Self.attempt("asking"))
        #expect(state.place(of: Self.attempt("asking")) == .placed)
        _ = state.askPlace(Self.attempt("run2"))
        // Leaving: the prefetched job, the one asking and the generation at the provider go back
        let (returned, actions) = state.leave()
        #expect(Set(returned.map(\.jobId)) == ["prefetched", "run2", "video"])
        #expect(actions.first == .send(.leaving(returned: returned)))
        #expect(actions.contains(.refusePlace(Self.attempt("run2"))))
        #expect(returned.allSatisfy { actions.contains(.stop($0)) })
        #expect(returned.allSatisfy { state.isHandedOff($0) } && !state.isHandedOff(Self.attempt("asking")))
        // A job assigned before the service heard it is given back as it comes
        #expect(Self.assign(&state, ["late"]) == [.send(.leaving(returned: [Self.attempt("late")]))])
        // No place any more, even one freed
        #expect(state.askPlace(Self.attempt("prefetched")) == [.refusePlace(Self.attempt("prefetched"))])
        for attempt in returned { _ = state.ended(attempt, result: nil) }
        let done = WorkerMessage.done(Self.attempt("asking"), JobOutput(resultKey: "r", thumbnailKey: "t"))
        #expect(state.ended(Self.attempt("asking"), result: done).contains(.empty))
        // Done only once its result is recorded and the service noted the leave
        #expect(!state.leaveDone)
        _ = state.received(.recorded(Self.attempt("asking")), now: Self.start)
        #expect(!state.leaveDone)
        _ = state.received(.leaveNoted, now: Self.start)
        #expect(state.leaveDone)
    }

    @Test func resultsAndProviderRequestsGoAgainWithEveryHeartbeatUntilRecorded() {
        var state = Self.machine()
        _ = Self.assign(&state, ["a", "b"])
        let request = ProviderRequest(provider: "fal", requestId: "r1", statusURL: "http://p/s", responseURL: "http://p/r", cancelURL: nil,
                                      submittedAt: Date(timeIntervalSince1970: 0))
        state.submitted(Self.attempt("b"), request)
        let done = WorkerMessage.done(Self.attempt("a"), JobOutput(resultKey: "r", thumbnailKey: "t"))
        _ = state.ended(Self.attempt("a"), result: done)
        var tick = state.tick(now: Self.start + .milliseconds(500))
        #expect(tick.contains(.resend([done])) && tick.contains(.send(.submitted(Self.attempt("b"), request))))
        guard case .send(.heartbeat(let running)) = tick.first else {
            Issue.record("no heartbeat first: \(tick)")
            return
        }
        #expect(Set(running) == [Self.attempt("a"), Self.attempt("b")], "held and unrecorded alike")
        _ = state.received(.all([.recorded(Self.attempt("a")), .submissionRecorded(Self.attempt("b"))]), now: Self.start + .seconds(1))
        tick = state.tick(now: Self.start + .milliseconds(1500))
        #expect(tick.contains(.resend([])) && !tick.contains(.send(.submitted(Self.attempt("b"), request))))
        // The service restarted and forgot this worker: everything again, `ready` first
        let again = state.received(.reconnect, now: Self.start + .seconds(2))
        #expect(Array(again.prefix(2)) == [.resetReports, .send(Self.ready)])
        #expect(again.contains(.send(.submitted(Self.attempt("b"), request))))
    }

    @Test func aReconnectWhileLeavingSaysLeavingAgain() {
        var state = Self.machine()
        _ = state.leave()
        _ = state.received(.leaveNoted, now: Self.start)
        #expect(state.leaveNoted)
        #expect(state.received(.reconnect, now: Self.start).contains(.send(.leaving(returned: []))))
        #expect(!state.leaveNoted, "the service must answer again")
    }

    @Test func threeHeartbeatsOfSilenceReconnectAndAnyMessageResetsTheSilence() {
        var state = Self.machine()
        // The first tick sends metrics; then every 5 s
        #expect(state.tick(now: Self.start + .seconds(1)).contains(.sendMetrics))
        #expect(!state.tick(now: Self.start + .seconds(2)).contains(.sendMetrics))
        #expect(!state.tick(now: Self.start + .seconds(3)).contains(.reconnect))
        // Never answered: reconnect, without the silent note (the connect loop says it once)
        let silent = state.tick(now: Self.start + .milliseconds(3100))
        #expect(silent.contains(.reconnect) && !silent.contains(.note(.silent)))
        // Answered, then silent for three heartbeats: reconnect, said
        _ = state.connected(now: Self.start + .seconds(4))
        #expect(state.received(.heartbeat, now: Self.start + .seconds(5)) == [.note(.connected)])
        let eight = state.tick(now: Self.start + .seconds(8))
        #expect(!eight.contains(.reconnect) && eight.contains(.sendMetrics), "metrics 7 s after the last")
        _ = state.received(.heartbeat, now: Self.start + .seconds(8))
        #expect(!state.tick(now: Self.start + .seconds(11)).contains(.reconnect))
        let after = state.tick(now: Self.start + .milliseconds(11_100))
        #expect(after.contains(.reconnect) && after.contains(.note(.silent)) && !after.contains(.sendMetrics))
    }

    @Test func freshURLsAndPokesAreKeptOnlyForHeldJobs() {
        var state = Self.machine()
        _ = Self.assign(&state, ["a"])
        let write = PresignedWrite(key: "k", url: "http://s/k", headers: [:])
        let transfer = JobTransfer(inputURL: "http://s/in", result: write, thumbnail: write, expiresAt: Date(timeIntervalSince1970: 100))
        _ = state.received(.renewed(Self.attempt("a"), transfer), now: Self.start)
        _ = state.received(.renewed(Self.attempt("gone"), transfer), now: Self.start)
        #expect(state.latestTransfer(Self.attempt("a")) == transfer && state.latestTransfer(Self.attempt("gone")) == nil)
        #expect(state.received(.poke(Self.attempt("a")), now: Self.start) == [.poke(Self.attempt("a"))])
        #expect(state.received(.poke(Self.attempt("gone")), now: Self.start).isEmpty)
        _ = state.ended(Self.attempt("a"), result: nil)
        #expect(state.latestTransfer(Self.attempt("a")) == nil)
    }

    @Test func aJobThatStopsWaitingIsRefusedAndAnEndedAskerToo() {
        var state = Self.machine(capacity: 1)
        _ = Self.assign(&state, ["a", "b"])
        _ = state.askPlace(Self.attempt("a"))
        _ = state.askPlace(Self.attempt("b"))
        #expect(state.withdraw(Self.attempt("b")) == [.refusePlace(Self.attempt("b"))])
        #expect(state.place(of: Self.attempt("b")) == .waiting)
        #expect(state.withdraw(Self.attempt("a")).isEmpty, "a has its place")
        _ = state.askPlace(Self.attempt("b"))
        #expect(state.ended(Self.attempt("b"), result: nil).first == .refusePlace(Self.attempt("b")))
    }

    @Test func resultsNotYetRecordedAreBounded() {
        var state = Self.machine()
        for index in 0...WorkerState.maxUnrecorded {
            _ = state.ended(Self.attempt("j\(index)"), result: .cancelled(Self.attempt("j\(index)")))
        }
        #expect(state.unrecorded.count == WorkerState.maxUnrecorded)
    }
}
