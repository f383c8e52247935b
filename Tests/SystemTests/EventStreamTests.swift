import Bus
import Foundation
import Messages
import ServiceKit
import Testing

@Suite("Job event streams against a gateway process", .serialized, .timeLimit(.minutes(5)))
struct EventStreamTests {
    /// Open descriptors of process `pid`.
    static func openDescriptors(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    /// The gateway as its own process in front of `system`'s services, on a free port.
    static func gatewayProcess(_ system: JobSystem, extra: [String: String], port: Int = freePort()) async throws -> (ServiceProcess, Int) {
        var environment = [
            "GATEWAY_PORT": "\(port)", "JWT_SECRET": JobSystem.secret, "ADMIN_TOKEN": JobSystem.adminToken,
            "BLOB_DIR": system.blobDirectory, "URL_SIGNING_SECRET": JobSystem.signingSecret, "PUBLIC_BASE_URL": system.publicBase,
        ]
        for service in ServiceName.allCases { environment[service.endpointVariable] = system.services.endpoints[service]! }
        let gateway = try ServiceProcess("gateway", environment: environment.merging(extra) { _, new in new })
        try await waitUntil {
            guard let connection = try? RawConnection(port: port, timeout: 2) else { return false }
            connection.send("GET /healthz HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
            return await connection.read(until: "\r\n\r\n").hasPrefix("HTTP/1.1 200")
        }
        return (gateway, port)
    }

    /// Opens an event stream of `jobId` as the guest `device`; returns it with the head and first event read.
    static func openStream(port: Int, device: UUID, jobId: String) async throws -> (RawConnection, String) {
        let connection = try RawConnection(port: port)
        connection.send("GET /api/v1/jobs/\(jobId)/events HTTP/1.1\r\nHost: g\r\nX-Device-Id: \(device.uuidString)\r\n\r\n")
        // An event ends with a blank line; a refusal is a problem object.
        let received = await connection.read(until: "\n\n", "}")
        return (connection, received)
    }

    /// A gateway process in front of `system` (no workers), a guest's queued job (it stays
    /// queued) and `count` streams of it, each past its first event (`queued`).
    static func streamsOfAQueuedJob(_ system: JobSystem, count: Int, extra: [String: String] = [:]) async throws
        -> (gateway: ServiceProcess, port: Int, user: String, job: JobRecord, streams: [RawConnection]) {
        let (gateway, port) = try await gatewayProcess(system, extra: extra)
        let device = UUID()
        let user = "device:\(device.uuidString.lowercased())"
        let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: "uploads/x/a.jpg", effectId: "copy"))
        var streams: [RawConnection] = []
        for _ in 0..<count {
            let (stream, first) = try await openStream(port: port, device: device, jobId: job.id)
            #expect(first.contains(#""status":"queued""#))
            streams.append(stream)
        }
        return (gateway, port, user, job, streams)
    }

    @Test func droppedStreamsFreeTheirSocketsAndTheBoundsAnswer503() async throws {
        let system = try await JobSystem(workers: 0)
        // (Keepalive comments every 10 minutes: a dropped stream is noticed by the gateway watching
        // its connection, not by a failed write of one of them.)
        let (gateway, port) = try await Self.gatewayProcess(system, extra: ["SSE_MAX_PER_USER": "200", "SSE_MAX_STREAMS": "300", "SSE_KEEPALIVE_S": "600"])
        // Given a user with two queued jobs (no workers: they stay queued, their streams stay open)
        let device = UUID()
        let user = "device:\(device.uuidString.lowercased())"
        var jobs: [String] = []
        for _ in 0..<2 {
            let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: "uploads/x/a.jpg", effectId: "copy"))
            jobs.append(job.id)
        }
        let (warm, _) = try await Self.openStream(port: port, device: device, jobId: jobs[0])
        warm.close()
        try await waitUntil { Self.openDescriptors(gateway.pid) > 0 }
        let before = Self.openDescriptors(gateway.pid)
        // When 200 streams are open
        var streams: [RawConnection] = []
        for index in 0..<200 {
            let (stream, first) = try await Self.openStream(port: port, device: device, jobId: jobs[index % 2])
            #expect(first.hasPrefix("HTTP/1.1 200") && first.contains("event: status"), "stream \(index): \(first.prefix(60))")
            streams.append(stream)
        }
        let open = Self.openDescriptors(gateway.pid)
        // Then the user's 201st is 503 with Retry-After, as a problem
        let (refused, answer) = try await Self.openStream(port: port, device: device, jobId: jobs[0])
        #expect(answer.hasPrefix("HTTP/1.1 503"), "answered \(answer.prefix(60))")
        #expect(answer.lowercased().contains("retry-after: 5"))
        refused.close()
        // And once the clients drop their streams, the gateway's descriptors return, long before a
        // keepalive comment is due (60 s: at once, on any machine; the comments' 600 s otherwise)
        for stream in streams { stream.close() }
        let dropped = ContinuousClock.now
        try await waitUntil(within: .seconds(60)) { Self.openDescriptors(gateway.pid) <= before }
        let after = Self.openDescriptors(gateway.pid)
        // (about 200 held while open: a descriptor more or less is the gateway's own business,
        // a log file or a bus reconnection)
        #expect(after <= before && open >= after + 190, "\(before) before, \(open) open, \(after) after")
        print("freed in \(dropped.duration(to: .now))")
        print("gateway descriptors: \(before) before, \(open) with 200 streams, \(after) after they were dropped")
        // And the places are free again
        let (again, reopened) = try await Self.openStream(port: port, device: device, jobId: jobs[1])
        #expect(reopened.hasPrefix("HTTP/1.1 200"))
        again.close()
        await gateway.stop()
        await system.stop()
    }

    @Test func everyStreamOfAJobHearsItsChangesAndEndsWithIt() async throws {
        let system = try await JobSystem(workers: 0)
        // Given three streams of one queued job, and a stranger's attempt at it
        let (gateway, port, user, job, streams) = try await Self.streamsOfAQueuedJob(system, count: 3)
        let (stranger, strangerAnswer) = try await Self.openStream(port: port, device: UUID(), jobId: job.id)
        #expect(strangerAnswer.hasPrefix("HTTP/1.1 404"))
        stranger.close()
        // When the job is cancelled
        _ = try await system.clients.jobs.call(Jobs.cancel, JobReference(jobId: job.id, userId: user))
        // Then every stream hears it and the gateway ends each one
        for stream in streams {
            let rest = await stream.read(until: "0\r\n\r\n")
            #expect(rest.contains(#""status":"cancelled""#), "stream got \(rest.suffix(120))")
            #expect(rest.hasSuffix("0\r\n\r\n"), "the stream did not end")
            stream.close()
        }
        await gateway.stop()
        await system.stop()
    }

    @Test func anIdleStreamGetsAKeepaliveCommentAtTheConfiguredInterval() async throws {
        let system = try await JobSystem(workers: 0)
        // Given a gateway that keeps its streams alive every second (the default is 15 s), and a
        // stream of a queued job that does not change (no workers)
        let (gateway, _, _, _, streams) = try await Self.streamsOfAQueuedJob(system, count: 1, extra: ["SSE_KEEPALIVE_S": "1"])
        let stream = try #require(streams.first)
        // Then comment lines keep coming, each within the connection's 10 s read limit (with the
        // default 15 s none would), and nothing else: the job did not change
        for index in 0..<3 {
            let received = await stream.read(until: ": keepalive\n\n")
            #expect(received.contains(": keepalive\n\n"), "comment \(index) did not come: \(received.prefix(120))")
            #expect(!received.contains("event:"), "an event of an unchanged job: \(received.prefix(120))")
        }
        stream.close()
        await gateway.stop()
        await system.stop()
    }

    /// A stream waits on its job, which may not end for minutes; the gateway's HTTP server stops
    /// gracefully by waiting for every answer to end. So a stopping gateway ends its streams
    /// itself, or a Ctrl-C waits for the app to hang up (make test's stop-check once met that).
    @Test func aStoppingGatewayEndsItsOpenStreamsAndExits() async throws {
        let system = try await JobSystem(workers: 0)
        // Given streams of a queued job (no workers: it stays queued)
        let (gateway, _, _, _, streams) = try await Self.streamsOfAQueuedJob(system, count: 3)
        // When the gateway is told to stop (SIGTERM; run.sh and a Ctrl-C send it too)
        gateway.signal(SIGTERM)
        // Then every stream ends (its last chunk, then the connection closes) with the job still queued
        for stream in streams {
            let rest = String(decoding: await stream.readAll(), as: UTF8.self)
            #expect(rest.hasSuffix("0\r\n\r\n"), "the stream did not end: \(rest.suffix(120))")
            stream.close()
        }
        // And the gateway exits, cleanly
        let status = try await gateway.waitForExit(within: .seconds(60))
        #expect(status == 0, "the gateway \(status.map { "exited with \($0)" } ?? "still runs 60 s after SIGTERM")")
        await gateway.stop()
        await system.stop()
    }
}
