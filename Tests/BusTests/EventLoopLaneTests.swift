import Foundation
import Messages
import NIOCore
import NIOPosix
import Testing

@testable import Bus

/// Event loops of a group of their own for the duration of `body`.
func withEventLoops<T: Sendable>(_ count: Int, _ body: ([any EventLoop]) async throws -> T)
    async throws -> T
{
    let group = MultiThreadedEventLoopGroup(numberOfThreads: count)
    do {
        let result = try await body(Array(group.makeIterator()))
        try await group.shutdownGracefully()
        return result
    } catch {
        try? await group.shutdownGracefully()
        throw error
    }
}

/// Runs `body` on `loop`.
func onEventLoop<T: Sendable>(
    _ loop: any EventLoop, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await Task(executorPreference: EventLoopTaskExecutor(loop)) {
        #expect(MultiThreadedEventLoopGroup.currentEventLoop === loop)
        return try await body()
    }.value
}

@Suite("Bus calls from event loops", .timeLimit(.minutes(5)))
struct EventLoopLaneTests {
    @Test func callsOnEventLoopsGoThroughEachLoopsOwnSocket() async throws {
        try await withEventLoops(2) { loops in
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            try await withServer(endpoint: endpoint) { _ in
                try await withClient(endpoint: endpoint) { client in
                    // Given calls from the pool: they use the client's I/O thread, and open no lane
                    #expect(
                        try await client.call(TestMethods.echo, Tagged(tag: 0, text: "pool"))
                            == Tagged(tag: 0, text: "pool"))
                    #expect(client.openLanes == 0)
                    // When 200 calls at once are made on each of two event loops
                    for (index, loop) in loops.enumerated() {
                        let replies = try await onEventLoop(loop) {
                            try await withThrowingTaskGroup(of: Tagged.self) { group in
                                for tag in 0..<200 {
                                    group.addTask {
                                        try await client.call(TestMethods.echo, Tagged(tag: tag, text: "loop \(index)"))
                                    }
                                }
                                return try await group.reduce(into: []) { $0.append($1) }
                            }
                        }
                        // Then each is answered with its own reply
                        #expect(
                            replies.sorted { $0.tag < $1.tag }
                                == (0..<200).map { Tagged(tag: $0, text: "loop \(index)") })
                    }
                    // And each loop has its socket, and the pool still its thread
                    #expect(client.openLanes == 2)
                    #expect(
                        try await client.call(TestMethods.echo, Tagged(tag: 1, text: "pool"))
                            == Tagged(tag: 1, text: "pool"))
                }
            }
        }
    }

    @Test func aCallOnAnEventLoopTimesOutAndIsCancelled() async throws {
        try await withEventLoops(1) { loops in
            let loop = loops[0]
            let endpoint = uniqueInproc()
            let gate = Gate()
            try await withServer(endpoint: endpoint, router: testRouter(gate: gate)) { _ in
                try await withClient(endpoint: endpoint) { client in
                    // Given a service that holds every `wait` call (and a client that is running:
                // calls made before it runs wait in its I/O thread's queue)
                _ = try await client.call(TestMethods.echo, Tagged(tag: 0, text: "running"))
                    // When a call on the event loop has a 300 ms deadline
                    let (error, elapsed) = try await onEventLoop(loop) {
                        let started = ContinuousClock.now
                        let error = await failure(client, TestMethods.wait, 1, timeout: .milliseconds(300))
                        return (error, started.duration(to: .now))
                    }
                    // Then it fails as a timeout once the deadline has passed, not before
                    #expect(error?.code == .timeout)
                    #expect(elapsed >= .milliseconds(300))
                    #expect(elapsed < .seconds(10))
                    #expect(client.openLanes == 1)
                    // And a call whose task is cancelled stops waiting
                    let call = Task(executorPreference: EventLoopTaskExecutor(loop)) {
                        await failure(client, TestMethods.wait, 2, timeout: .seconds(30))
                    }
                    while gate.arrived < 2 { try await Task.sleep(for: .milliseconds(5)) }
                    call.cancel()
                    #expect(await call.value?.code == .cancelled)
                    gate.open()
                }
            }
        }
    }

    @Test func aCallOnAnEventLoopToAServiceNeverReachedFailsAsUnreached() async throws {
        try await withEventLoops(1) { loops in
            let loop = loops[0]
            // Given nothing listening on the endpoint
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            try await withClient(endpoint: endpoint) { client in
                // (running: calls made before wait in its I/O thread's queue)
                while !client.isRunning { try await Task.sleep(for: .milliseconds(5)) }
                // When a call on the event loop has a 300 ms deadline
                let error = try await onEventLoop(loop) {
                    await failure(client, TestMethods.echo, Tagged(tag: 1, text: ""), timeout: .milliseconds(300))
                }
                // Then it went out on the loop's socket and failed as `connection_lost` (the
                // gateway's 503), not as the timeout of a service that was reached
                #expect(client.openLanes == 1)
                #expect(error?.code == .connectionLost)
                #expect(error?.retryable == true)
            }
        }
    }

    @Test func aCallOnAnEventLoopSurvivesTheServiceRestarting() async throws {
        try await withEventLoops(1) { loops in
            let loop = loops[0]
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            try await withClient(endpoint: endpoint) { client in
                try await withServer(endpoint: endpoint) { _ in
                    let reply = try await onEventLoop(loop) {
                        try await client.call(TestMethods.echo, Tagged(tag: 1, text: "before"))
                    }
                    #expect(reply.text == "before")
                }
                // While the service is down, a call fails in bounded time (as in
                // `callerKeepsWorkingWhenTheServiceRestartsOnTheSameEndpoint`)
                let whileDown = try await onEventLoop(loop) {
                    await failure(
                        client, TestMethods.echo, Tagged(tag: 2, text: ""), timeout: .milliseconds(300))
                }
                #expect([.timeout, .connectionLost].contains(whileDown?.code))
                // And once it is back, the same loop's socket reconnects and is answered
                try await withServer(endpoint: endpoint) { _ in
                    let reply = try await onEventLoop(loop) {
                        try await client.call(
                            TestMethods.echo, Tagged(tag: 3, text: "after"), timeout: .seconds(5))
                    }
                    #expect(reply == Tagged(tag: 3, text: "after"))
                }
                #expect(client.openLanes == 1)
            }
        }
    }

    @Test func stoppingTheClientFailsWaitingCallsAndClosesItsLanes() async throws {
        try await withEventLoops(1) { loops in
            let loop = loops[0]
            let endpoint = uniqueInproc()
            let gate = Gate()
            try await withServer(endpoint: endpoint, router: testRouter(gate: gate)) { _ in
                // Given a call held by the service, made on an event loop
                let (client, held) = try await withClient(endpoint: endpoint) { client in
                _ = try await client.call(TestMethods.echo, Tagged(tag: 0, text: "running"))
                    let held = Task(executorPreference: EventLoopTaskExecutor(loop)) {
                        await failure(client, TestMethods.wait, 1, timeout: .seconds(30))
                    }
                    while gate.arrived < 1 { try await Task.sleep(for: .milliseconds(5)) }
                    #expect(client.openLanes == 1)
                    return (client, held)
                }
                // When the client has stopped, the call has failed as unavailable
                #expect(await held.value?.code == .unavailable)
                // And its lane is closed, and a call on the loop is refused at once
                #expect(client.openLanes == 0)
                let after = try await onEventLoop(loop) {
                    await failure(client, TestMethods.echo, Tagged(tag: 1, text: ""))
                }
                #expect(after?.code == .unavailable)
                gate.open()
            }
        }
    }
}

@Suite("Bus calls from an event loop that shuts down first", .timeLimit(.minutes(5)))
struct EventLoopLaneShutdownTests {
    @Test func aClientOutlivingTheLoopOfItsLaneStillStops() async throws {
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                // Given a lane on a loop that shuts down while the client runs
                _ = try await client.call(TestMethods.echo, Tagged(tag: 0, text: "running"))
                try await withEventLoops(1) { loops in
                    let reply = try await onEventLoop(loops[0]) { try await client.call(TestMethods.echo, Tagged(tag: 1, text: "loop")) }
                    #expect(reply.text == "loop")
                }
                // Then the lane closed with its loop
                let deadline = ContinuousClock.now.advanced(by: .seconds(10))
                while client.openLanes > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
                #expect(client.openLanes == 0)
                // And the client still answers calls from the pool, and its scope ends
                #expect(try await client.call(TestMethods.echo, Tagged(tag: 2, text: "pool")).text == "pool")
            }
        }
    }
}
