import Bus
import Foundation
import Messages
import ServiceKit
import Testing
import ZeroMQ

@Suite("Bus between processes", .serialized, .timeLimit(.minutes(5)))
struct BusProcessTests {
    @Test func roundTripOverTCPLoopbackBetweenTwoProcesses() async throws {
        // Given the fixture service in its own process
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
        try await withBusClient(.init(endpoint: endpoint)) { client in
            let health = try await waitUntilHealthy(client)
            // When this process calls it
            let reply = try await client.call(FixtureMethods.echo, "across processes")
            // Then the reply comes back, from the other process
            #expect(reply == "across processes")
            #expect(health.pid == service.pid)
            #expect(health.service == "jobs")
            await service.stop()
        }
    }

    @Test func aServiceStartedWithExitWithParentStopsWhenItsParentDies() async throws {
        // Given the fixture service started in the background by a shell that then exits, asked
        // to exit with that shell
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let shell = Process()
        shell.executableURL = URL(fileURLWithPath: "/bin/sh")
        shell.arguments = ["-c", "EXIT_WITH_PARENT=$$ \"$0\" > /dev/null 2>&1 & echo $!", ServiceProcess.binaryDirectory.appendingPathComponent("bus-fixture").path]
        var environment = ProcessInfo.processInfo.environment
        environment["JOBS_BIND"] = endpoint
        environment["LOG_LEVEL"] = "warning"
        shell.environment = environment
        let output = Pipe()
        shell.standardOutput = output
        try shell.run()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let pid = try #require(Int32(printed.trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(pid, SIGKILL) }
        // Then it stops by itself (it would otherwise run on, its parent gone)
        let deadline = ContinuousClock.now.advanced(by: .seconds(15))
        while kill(pid, 0) == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        #expect(kill(pid, 0) != 0, "the service outlived the process that started it")
    }

    @Test func anExitIsSeenEvenWhileAnotherProcessHoldsTheSocketFoundationWatches() async throws {
        // Given a child that leaves a grandchild behind (which inherits the socket by which
        // Foundation's Process learns of the child's exit) and exits with 3
        let pidFile = FileManager.default.temporaryDirectory.appendingPathComponent("grandchild-\(UUID().uuidString)")
        let child = try ServiceProcess("bus-fixture", wrappedBy: ["/bin/sh", "-c", "sleep 30 & echo $! > '\(pidFile.path)'; exit 3"], environment: [:])
        defer {
            if let text = try? String(contentsOf: pidFile, encoding: .utf8), let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) { kill(pid, SIGKILL) }
            try? FileManager.default.removeItem(at: pidFile)
        }
        // Then its exit and status are seen at once, though Process still calls it running
        let status = try await child.waitForExit(within: .seconds(5))
        #expect(status == 3)
    }

    @Test func sigtermLetsTheRequestInProgressFinishAndExitsZero() async throws {
        // Given a service handling a request that takes 1.5 s
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
        try await withBusClient(.init(endpoint: endpoint)) { client in
            _ = try await waitUntilHealthy(client)
            let slow = Task { try await client.call(FixtureMethods.sleep, 1500, timeout: .seconds(10)) }
            let started = try await waitForValue { service.output.contains("sleeping") ? true : nil }
            #expect(started == true, "the request never reached the service")
            // When it gets SIGTERM in the middle of it
            service.signal(SIGTERM)
            // Then the request still gets its reply, and the process exits 0
            let reply = try await slow.value
            #expect(reply == 1500)
            let status = try await service.waitForExit()
            #expect(status == 0)
            #expect(service.output.contains("draining"))
        }
    }

    @Test func aCallInFlightToAServiceThatDiesFailsAtOnceAsConnectionLost() async throws {
        // Given a service handling a request that never ends (10 min), with a 120 s deadline
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
        try await withBusClient(.init(endpoint: endpoint)) { client in
            _ = try await waitUntilHealthy(client)
            let slow = Task { () -> (BusError?, ContinuousClock.Instant) in
                do {
                    _ = try await client.call(FixtureMethods.sleep, 600_000, timeout: .seconds(120))
                    return (nil, .now)
                } catch {
                    return (error as? BusError, .now)
                }
            }
            let reached = try await waitForValue { service.output.contains("sleeping") ? true : nil }
            #expect(reached == true, "the request never reached the service")
            // When the process is killed outright
            let killed = ContinuousClock.now
            service.signal(SIGKILL)
            // Then the call fails as connection_lost (outcome unknown, retryable), not at its
            // deadline: a client that only noticed the lost connection at the deadline would also
            // say connection_lost, so the time since the kill tells the two apart. Half the
            // deadline is the bound, so a busy machine's slowness cannot fail it; at once is well
            // under a second.
            let (error, failed) = await slow.value
            #expect(error?.code == .connectionLost)
            #expect(error?.retryable == true)
            let afterKill = killed.duration(to: failed)
            #expect(afterKill < .seconds(60), "the call failed \(afterKill) after the kill")
            // And a call made while the service is down still waits for it (not failed at once)
            let waiting = Task { try await client.call(FixtureMethods.echo, "later", timeout: .seconds(15)) }
            _ = try await service.waitForExit()
            let again = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
            #expect(try await waiting.value == "later")
            await again.stop()
        }
    }

    @Test func sameCallerSucceedsAfterTheServiceIsKilledAndRestarted() async throws {
        // Given a caller of a service process
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        var service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
        try await withBusClient(.init(endpoint: endpoint)) { client in
            _ = try await waitUntilHealthy(client)
            // When the process is killed outright
            service.signal(SIGKILL)
            _ = try await service.waitForExit()
            let whileDown: BusError?
            do throws(BusError) {
                _ = try await client.call(FixtureMethods.echo, "anyone?", timeout: .milliseconds(300))
                whileDown = nil
            } catch {
                whileDown = error
            }
            // (`connection_lost` at the deadline, or at once if the client hears of the broken
            // connection only after sending; a timeout if it hears of it after the deadline)
            #expect([.timeout, .connectionLost].contains(whileDown?.code))
            // And started again on the same endpoint
            service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
            // Then the same client's next request succeeds
            let reply = try await client.call(FixtureMethods.echo, "back", timeout: .seconds(10))
            #expect(reply == "back")
            await service.stop()
        }
    }

    @Test func serviceWithACurveKeyFromTheEnvironmentAnswersOnlyEncryptedCallers() async throws {
        let pair = try ZMQCurveKeyPair.generate()
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let service = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint, "BUS_CURVE_SECRET": pair.secretKey])
        let keys = try #require(try BusSecurity.clientKeys(Environment(["BUS_CURVE_PUBLIC": pair.publicKey])))
        try await withBusClients([.init(endpoint: endpoint, curve: keys), .init(endpoint: endpoint)]) { clients in
            let (trusted, plain) = (clients[0], clients[1])
            _ = try await waitUntilHealthy(trusted)
            #expect(try await trusted.call(FixtureMethods.echo, "sealed") == "sealed")
            do throws(BusError) {
                _ = try await plain.call(FixtureMethods.echo, "open", timeout: .milliseconds(500))
                Issue.record("a plain caller was answered by a CURVE service")
            } catch {
                // The handshake fails and the connection drops: unanswered, at the deadline or before.
                // A call made after libzmq gave up on the refused connection (a handshake's protocol
                // error ends the session, so no pipe is left to queue on) is refused as `overloaded`.
                #expect([.connectionLost, .overloaded].contains(error.code), "\(error)")
            }
        }
        await service.stop()
    }

    @Test func serviceWhoseEndpointIsTakenExitsWithAnError() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let first = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
        try await withBusClient(.init(endpoint: endpoint)) { client in
            _ = try await waitUntilHealthy(client)
            let second = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoint])
            let status = try await second.waitForExit()
            #expect(status != nil && status != 0)
            #expect(second.output.contains("cannot bind"))
            await first.stop()
        }
    }

    @Test func everyServiceExecutableAnswersHealthAndStopsCleanly() async throws {
        let services = try RunningServices()
        for service in ServiceName.allCases {
            try await withBusClient(.init(endpoint: services.endpoints[service]!)) { client in
                let report = try await waitUntilHealthy(client)
                #expect(report.service == service.rawValue)
                #expect(report.version == BuildInfo.version)
                #expect(report.pid == services.processes[service]!.pid)
            }
        }
        for process in services.processes.values {
            process.signal(SIGINT)
            #expect(try await process.waitForExit() == 0)
        }
        await services.stopAll()
    }
}

/// A service's replicas behind one endpoint setting (`tcp://a,tcp://b`): calls spread over them,
/// and a retry-safe call whose replica died is answered by another.
@Suite("Bus replicas", .timeLimit(.minutes(5)))
struct BusReplicaTests {
    @Test func callsSpreadOverReplicasAndARetrySafeCallSurvivesTheDeathOfOne() async throws {
        let endpoints = ["tcp://127.0.0.1:\(freePort())", "tcp://127.0.0.1:\(freePort())"]
        let replicas = try endpoints.map { try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": $0]) }
        try await withBusClient(.init(endpoint: endpoints.joined(separator: ","), defaultTimeout: .seconds(20))) { client in
            // Both replicas answer, each in turn
            try await waitUntil {
                var seen = Set<Int32>()
                for _ in 0..<8 { if let pid = try? await client.call(FixtureMethods.replica, 0) { seen.insert(pid) } }
                return seen == Set(replicas.map(\.pid))
            }
            // When one dies (kill -9) with calls in flight at it: it holds every call it gets
            // until it dies (the fixture holds a call that names its pid), the other answers
            // them at once, so no bound on the machine's speed decides who answers
            let doomed = replicas[0].pid
            let calls = (0..<20).map { _ in Task { try await client.call(FixtureMethods.replica, -Int(doomed)) } }
            try await waitUntil(within: .seconds(60)) { replicas[0].output.contains("holding a replica call") }
            replicas[0].signal(SIGKILL)
            // Then every call is answered, by the one alive
            for call in calls { #expect(try await call.value == replicas[1].pid) }
            // And the next calls go to it alone
            for _ in 0..<4 { #expect(try await client.call(FixtureMethods.replica, 0) == replicas[1].pid) }
        }
        for replica in replicas { await replica.stop() }
    }

    @Test func aCallMadeBeforeAnyReplicaIsUpWaitsForOne() async throws {
        let endpoints = ["tcp://127.0.0.1:\(freePort())", "tcp://127.0.0.1:\(freePort())"]
        try await withBusClient(.init(endpoint: endpoints.joined(separator: ","), defaultTimeout: .seconds(15))) { client in
            // Given a call made while no replica runs
            let call = Task { try await client.call(FixtureMethods.replica, 0) }
            // When one starts, then the call is answered by it (not refused for want of a peer)
            let replica = try ServiceProcess("bus-fixture", environment: ["JOBS_BIND": endpoints[1]])
            #expect(try await call.value == replica.pid)
            await replica.stop()
        }
    }
}
