import Foundation
import HTTPTypes
import Messages
import ServiceKit
import Testing

/// `GET /metrics`: the gateway's own metrics and those it gathers from every service and worker.
@Suite("Metrics", .serialized, .timeLimit(.minutes(5)))
struct MetricsTests {
    static func get(_ path: String, port: Int, headers: String = "") async -> String {
        guard let connection = try? RawConnection(port: port, timeout: 5) else { return "" }
        connection.send("GET \(path) HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\(headers)\r\n")
        return await connection.read(until: "\u{0}")
    }

    /// The scrape's head and its exposition, parsed strictly (a parse failure fails the test).
    static func scrape(port: Int) async throws -> (head: String, exposition: PrometheusExposition) {
        let response = await get("/metrics", port: port)
        let parts = response.components(separatedBy: "\r\n\r\n")
        let body = parts.dropFirst().joined(separator: "\r\n\r\n")
        do {
            return (parts.first ?? "", try PrometheusExposition(body))
        } catch {
            Issue.record("the exposition does not parse: \(error)\n\(body.prefix(3000))")
            throw error
        }
    }

    /// The value of the `http_server_requests_total` sample of `route` with `status`.
    static func requests(_ exposition: PrometheusExposition, route: String, status: Int) -> Double {
        exposition.sum("http_server_requests_total", ["service": "gateway", "http_route": route, "http_response_status_code": "\(status)"])
    }

    @Test func theGatewaysCountersMoveAndTheExpositionParses() async throws {
        let system = try await JobSystem(workers: 0)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        let device = "X-Device-Id: \(UUID().uuidString)\r\n"
        for _ in 0..<3 { #expect(await Self.get("/api/v1/users/me", port: port, headers: device).hasPrefix("HTTP/1.1 200")) }
        #expect(await Self.get("/api/v1/users/me", port: port).hasPrefix("HTTP/1.1 401"))
        var scraped = try await Self.scrape(port: port)
        try await waitUntil {
            scraped = try await Self.scrape(port: port)
            return Self.requests(scraped.exposition, route: "/api/v1/users/me", status: 200) >= 3
        }
        #expect(scraped.head.contains("text/plain; version=0.0.4"))
        #expect(Self.requests(scraped.exposition, route: "/api/v1/users/me", status: 401) == 1)
        #expect(scraped.exposition.types["http_server_request_duration_seconds"] == "histogram")
        #expect(scraped.exposition.value("http_server_active_requests", ["service": "gateway"]) != nil)
        #expect(scraped.exposition.sum("http_server_request_duration_seconds_count", ["service": "gateway", "http_route": "/api/v1/users/me"]) >= 4)
        // A 401 is not a server error; a path no route has counts under `unknown`, whatever it was
        #expect(scraped.exposition.sum("http_server_request_errors_total", ["service": "gateway", "http_route": "/api/v1/users/me"]) == 0)
        _ = await Self.get("/no/such/\(UUID().uuidString)", port: port)
        try await waitUntil { Self.requests(try await Self.scrape(port: port).exposition, route: "unknown", status: 404) == 1 }
        // One more request moves its counter by one
        let before = Self.requests(scraped.exposition, route: "/api/v1/users/me", status: 200)
        _ = await Self.get("/api/v1/users/me", port: port, headers: device)
        try await waitUntil { Self.requests(try await Self.scrape(port: port).exposition, route: "/api/v1/users/me", status: 200) == before + 1 }
        await gateway.stop()
        await system.stop()
    }

    /// Right after the start, before anything moved, the series whose labels are known are there
    /// at zero (so `rate()` is 0, not absent), and every family has HELP text.
    @Test func knownSeriesExistAtZeroFromTheStartWithHelp() async throws {
        let system = try await JobSystem(workers: 0)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        let body = await Self.get("/metrics", port: port).components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        let exposition = try PrometheusExposition(body)
        for (name, labels) in [
            ("bus_requests_total", ["service": "quota", "method": "quota.reserve", "code": "ok"]),
            ("bus_handler_duration_seconds_count", ["service": "jobs", "method": "jobs.create"]),
            ("bus_overloaded_total", ["service": "history", "method": "history.list"]),
            ("quota_decisions_total", ["service": "quota", "decision": "denied", "window": "daily"]),
            ("history_events_received_total", ["service": "history"]),
            ("jobs_results_total", ["service": "jobs", "effect": "copy", "state": "failed"]),
            ("jobs_requeued_total", ["service": "jobs", "cause": "worker_lost"]),
            ("jobs_workers_connected", ["service": "jobs"]),
            ("jobs_oldest_queued_age_seconds", ["service": "jobs"]),
            ("http_server_request_errors_total", ["service": "gateway", "http_route": "/api/v1/jobs", "http_request_method": "POST"]),
            ("http_server_request_duration_seconds_count", ["service": "gateway", "http_route": "/api/v1/history/{jobId}", "http_request_method": "DELETE"]),
            ("gateway_connections_refused_total", ["service": "gateway"]),
        ] {
            #expect(exposition.value(name, labels) == 0, "\(name) \(labels)")
        }
        #expect((exposition.value("photoedit_disk_free_bytes", ["service": "quota"]) ?? 0) > 0)
        #expect((exposition.value("photoedit_disk_size_bytes", ["service": "gateway"]) ?? 0) > 0)
        let lines = body.split(separator: "\n")
        let typed = Set(lines.filter { $0.hasPrefix("# TYPE ") }.map { $0.split(separator: " ")[2] })
        let helped = Set(lines.filter { $0.hasPrefix("# HELP ") }.map { $0.split(separator: " ")[2] })
        #expect(!typed.isEmpty && typed.subtracting(helped).isEmpty, "without HELP: \(typed.subtracting(helped).sorted())")
        await gateway.stop()
        await system.stop()
    }

    /// Each service's and each worker's metrics reach the gateway's scrape, labelled, and move as
    /// a job is created, run and recorded in history.
    @Test func everyServiceAndWorkerIsScrapedThroughTheGateway() async throws {
        let system = try await JobSystem(workers: 1)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        let user = JobSystem.guest(UUID())
        var first = try await Self.scrape(port: port).exposition
        for service in ["quota", "history", "jobs"] {
            #expect(first.value("photoedit_scrape_up", ["service": service]) == 1, "\(service) did not answer")
        }
        let reserves = first.sum("bus_requests_total", ["service": "quota", "method": "quota.reserve", "code": "ok"])
        try await system.gateway { client in
            let key = try await JobSystem.upload(client, as: user)
            for _ in 0..<2 {
                let created = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy")
                #expect(created.status == .accepted)
                let jobId = try JobSystem.jobId(of: created)
                #expect(try await JobSystem.waitForStatus(client, as: user, jobId: jobId)["status"] as? String == "completed")
            }
        }
        // The worker reports every 5 s: wait for its count and history's events.
        try await waitUntil(within: .seconds(20)) {
            first = try await Self.scrape(port: port).exposition
            return first.sum("worker_jobs_total", ["service": "worker", "worker": "w1", "effect": "copy", "outcome": "completed"]) == 2
                && first.sum("history_events_applied_total", ["service": "history"]) >= 2
        }
        let exposition = first
        #expect(exposition.sum("bus_requests_total", ["service": "quota", "method": "quota.reserve", "code": "ok"]) == reserves + 2)
        #expect(exposition.sum("quota_decisions_total", ["service": "quota", "decision": "admitted", "window": "daily"]) == 2)
        #expect(exposition.sum("quota_decisions_total", ["service": "quota", "decision": "admitted", "window": "monthly"]) == 2)
        #expect(exposition.sum("bus_handler_duration_seconds_count", ["service": "jobs", "method": "jobs.create"]) == 2)
        #expect(exposition.value("bus_requests_in_progress", ["service": "quota"]) != nil)
        #expect(exposition.value("jobs_by_state", ["service": "jobs", "state": "completed"]) == 2)
        #expect(exposition.value("jobs_queue_length", ["service": "jobs"]) == 0)
        #expect(exposition.value("jobs_workers_connected", ["service": "jobs"]) == 1)
        #expect(exposition.sum("jobs_results_total", ["service": "jobs", "effect": "copy", "state": "completed"]) == 2)
        #expect(exposition.sum("jobs_wait_before_assignment_seconds_count", ["service": "jobs"]) == 2)
        #expect(exposition.sum("jobs_run_duration_seconds_count", ["service": "jobs", "effect": "copy"]) == 2)
        #expect(exposition.value("jobs_outbox_backlog", ["service": "jobs", "topic": "quota"]) != nil)
        #expect(exposition.sum("history_event_lag_seconds_count", ["service": "history"]) >= 2)
        #expect(exposition.sum("worker_job_duration_seconds_count", ["service": "worker", "worker": "w1", "effect": "copy"]) == 2)

        // A quota denial counts by window; an unknown method does not add a series of its own.
        let denials = exposition.sum("quota_decisions_total", ["decision": "denied"])
        let report = try await system.clients.quota.call(Quota.reserve, ReserveQuota(userId: "metrics-user", jobId: UUID().uuidString, cost: 1000))
        #expect(!report.admitted)
        _ = try? await system.clients.quota.call(BusMethod<Empty, Empty>("no.such.method", roles: Set(BusRole.known)), Empty())
        try await waitUntil {
            let now = try await Self.scrape(port: port).exposition
            return now.sum("quota_decisions_total", ["decision": "denied", "window": "daily"]) == denials + 1
                && now.sum("bus_requests_total", ["service": "quota", "method": "unknown", "code": "unknown_method"]) == 1
        }

        // A service that is down answers 0 in photoedit_scrape_up; the others still come.
        await system.services.stop(.history)
        let partial = try await Self.scrape(port: port).exposition
        #expect(partial.value("photoedit_scrape_up", ["service": "history"]) == 0)
        #expect(partial.value("photoedit_scrape_up", ["service": "quota"]) == 1)
        #expect(partial.sum("history_events_applied_total") == 0)
        await gateway.stop()
        await system.stop()
    }

    @Test func mergingKeepsOneFamilyTogetherAndDropsGarbage() throws {
        let gateway = "# HELP bus_requests_total Requests.\n# TYPE bus_requests_total counter\nbus_requests_total{method=\"a\"} 1\n"
        let quota = "# TYPE bus_requests_total counter\nbus_requests_total{method=\"b\"} 2\nnot a sample\n{bad} 3\n# TYPE up gauge\nup 1\n"
        let merged = PrometheusText.merge([
            MetricsSection(labels: ["service": "gateway"], text: gateway),
            MetricsSection(labels: ["service": "quota", "worker": "a\"b"], text: quota),
        ])
        let exposition = try PrometheusExposition(merged)
        #expect(merged.components(separatedBy: "# TYPE bus_requests_total").count == 2)
        #expect(exposition.value("bus_requests_total", ["service": "gateway", "method": "a"]) == 1)
        #expect(exposition.value("bus_requests_total", ["service": "quota", "method": "b", "worker": "a\"b"]) == 2)
        #expect(exposition.value("up", ["service": "quota"]) == 1)
        #expect(exposition.samples.count == 3)
        // The reader itself refuses a family split in two and a repeated series.
        #expect(throws: PrometheusExposition.Malformed.self) { try PrometheusExposition("a 1\nb 1\na{x=\"1\"} 2\n") }
        #expect(throws: PrometheusExposition.Malformed.self) { try PrometheusExposition("a 1\na 2\n") }
    }
}

/// What the processes log at `info`, the level `make run` uses, and at `debug`.
@Suite("Logs at info", .serialized, .timeLimit(.minutes(5)))
struct InfoLogTests {
    @Test func requestsAreLoggedAtDebugOnlyOneAccessLineEach() async throws {
        let system = try await JobSystem(workers: 0, quota: ["LOG_LEVEL": "info"])
        let (quiet, quietPort) = try await ClientLibraryTests.gateway(system, extra: ["LOG_LEVEL": "info"])
        let (verbose, verbosePort) = try await ClientLibraryTests.gateway(system, extra: ["LOG_LEVEL": "debug"])
        let requestId = "access-\(UUID().uuidString)"
        for port in [quietPort, verbosePort] {
            let answer = await MetricsTests.get("/api/v1/users/me?x=secret", port: port, headers: "X-Device-Id: \(UUID().uuidString)\r\nX-Request-Id: \(requestId)\r\n")
            #expect(answer.hasPrefix("HTTP/1.1 200"))
        }
        // At debug: one line, with method, path (no query), status, duration and the request id
        try await waitUntil { verbose.output.contains(requestId) }
        let lines = verbose.output.split(separator: "\n").filter { $0.contains(requestId) && $0.contains("GET /api/v1/users/me") }
        #expect(lines.count == 1, "\(lines)")
        #expect(lines.first?.contains("GET /api/v1/users/me 200 ") == true && lines.first?.contains("secret") == false, "\(lines)")
        // At info: no line for the request in the gateway, nor in quota, which answered its bus call
        #expect(!quiet.output.contains(requestId))
        #expect(!system.services.processes[.quota]!.output.contains(requestId))
        #expect(!system.services.processes[.quota]!.output.contains("handled"))
        await quiet.stop()
        await verbose.stop()
        await system.stop()
    }
}

/// `LOG_FORMAT=json`: what a log shipper (Loki, Vector, a cloud log service) reads.
@Suite("JSON logs", .serialized, .timeLimit(.minutes(5)))
struct JSONLogTests {
    @Test func everyLineOfEveryProcessIsOneJSONObjectAndRequestsCarryTheirId() async throws {
        // Given the stack with JSON logs, at debug (every bus request logged)
        let json = ["LOG_FORMAT": "json", "LOG_LEVEL": "debug"]
        let system = try await JobSystem(workers: 0, quota: json, history: json, jobs: json)
        let worker = try system.startWorker(extra: json)
        let (gateway, port) = try await ClientLibraryTests.gateway(system, extra: json)
        // When a request with an id of the test's reaches the gateway and quota, and an edit runs
        // through jobs, the worker and history
        let requestId = "json-\(UUID().uuidString)"
        let answer = await MetricsTests.get("/api/v1/users/me", port: port, headers: "X-Device-Id: \(UUID().uuidString)\r\nX-Request-Id: \(requestId)\r\n")
        #expect(answer.hasPrefix("HTTP/1.1 200"))
        let app = ClientLibraryTests.client(port)
        let key = try await app.upload(try Data(contentsOf: JobSystem.fixture))
        let ticket = try await app.createJob(imageKey: key, effect: "grayscale")
        try await waitUntil(within: .seconds(30)) { (try? await app.status(of: ticket.jobId))?.status == "completed" }

        // Then every line of every process is a JSON object with the fields a shipper indexes
        let processes: [(String, ServiceProcess)] = [
            ("gateway", gateway), ("quota", system.services.processes[.quota]!), ("jobs", system.services.processes[.jobs]!),
            ("history", system.services.processes[.history]!), ("w1", worker),
        ]
        try await waitUntil { system.services.processes[.quota]!.output.contains(requestId) }
        var ids: [String: Set<String>] = [:]
        for (name, process) in processes {
            let lines = process.output.split(separator: "\n")
            #expect(!lines.isEmpty, "\(name) wrote nothing")
            for line in lines {
                let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                guard let object else {
                    Issue.record("\(name): not a JSON object: \(line)")
                    continue
                }
                #expect(object["process"] as? String == name, "\(line)")
                #expect(["trace", "debug", "info", "notice", "warning", "error", "critical"].contains(object["level"] as? String ?? ""), "\(line)")
                #expect((object["message"] as? String)?.isEmpty == false, "\(line)")
                let time = object["time"] as? String ?? ""
                #expect(ISO8601DateFormatter.withFractions.date(from: time) != nil, "\(line)")
                if let id = object["request_id"] as? String { ids[name, default: []].insert(id) }
            }
        }
        // And the request's id is on the lines of both processes that handled it, as `request_id`
        #expect(ids["gateway"]?.contains(requestId) == true)
        #expect(ids["quota"]?.contains(requestId) == true)
        // And the edit's requests were followed into jobs under the ids the gateway gave them
        #expect(!(ids["jobs"] ?? []).isDisjoint(with: ids["gateway"] ?? []))
        await gateway.stop()
        await system.stop()
    }
}

extension ISO8601DateFormatter {
    /// `2026-11-22T14:01:21.123Z`.
    static var withFractions: ISO8601DateFormatter {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter
    }
}
