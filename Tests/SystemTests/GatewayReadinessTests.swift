import Foundation
import Logging
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import ServiceKit
import Testing

@Suite("Gateway health and readiness", .serialized, .timeLimit(.minutes(5)))
struct GatewayReadinessTests {
    /// Runs `body` with the gateway's router wired to the given endpoints, and its bus clients.
    /// `files`: with the routes that need a blob store (uploads, jobs, history), on a folder.
    func gateway(endpoints: [ServiceName: String], files: Bool = false, extra: [String: String] = [:],
                 _ body: (any ApplicationProtocol, ServiceClients) async throws -> Void) async throws {
        var environment = Dictionary(uniqueKeysWithValues: endpoints.map { ($0.key.endpointVariable, $0.value) }).merging(extra) { $1 }
        if files { environment["BLOB_DIR"] = FileManager.default.temporaryDirectory.appendingPathComponent("gateway-\(UUID().uuidString)").path }
        let configuration = try GatewayConfiguration(environment: Environment(environment))
        let blobs = files ? try await configuration.blobs.open() : nil
        let clients = ServiceClients(configuration: configuration)
        let authenticator = try await Authenticator(jwtSecret: nil, adminToken: nil)
        let streams = JobStreams(jobs: clients.jobs, perUser: configuration.streamsPerUser, total: configuration.streamsTotal, logger: Logger(label: "test"))
        let app = Application(router: buildRouter(clients: clients, authenticator: authenticator, configuration: configuration, streams: streams, blobs: blobs), services: [streams])
        try await clients.running { try await body(app, clients) }
    }

    @Test func readyzIs200WithEveryServiceUpThen503NamingTheStoppedOne() async throws {
        // Given the three services running as processes
        let services = try RunningServices()
        try await gateway(endpoints: services.endpoints) { app, clients in
            for service in ServiceName.allCases { _ = try await waitUntilHealthy(clients.client(for: service)) }

            try await app.test(.router) { client in
                // When every service answers
                try await client.execute(uri: "/readyz", method: .get) { response in
                    // Then readiness is 200 and names each one as up
                    #expect(response.status == .ok)
                    let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                    let named = body?["services"] as? [String: [String: Any]]
                    #expect(Set(named?.keys.map { $0 } ?? []) == ["quota", "history", "jobs"])
                    #expect(named?.values.allSatisfy { $0["status"] as? String == "up" } == true)
                }
                // When jobs stops
                await services.processes[.jobs]!.stop()
                try await client.execute(uri: "/readyz", method: .get) { response in
                    // Then readiness is 503 problem+json naming jobs, and only jobs
                    #expect(response.status == .serviceUnavailable)
                    #expect(response.headers[.contentType] == "application/problem+json")
                    let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                    #expect(body?["unavailable"] as? [String] == ["jobs"])
                    #expect(body?["status"] as? Int == 503)
                }
            }
        }
        await services.stopAll()
    }

    @Test func requestIdReachesTheLogsOfEveryProcessThatHandledIt() async throws {
        let services = try RunningServices()
        try await gateway(endpoints: services.endpoints) { app, clients in
            for service in ServiceName.allCases { _ = try await waitUntilHealthy(clients.client(for: service)) }
            let requestId = "trace-\(UUID().uuidString)"

            try await app.test(.router) { client in
                try await client.execute(uri: "/readyz", method: .get, headers: [.init("X-Request-Id")!: requestId]) { response in
                    #expect(response.status == .ok)
                    #expect(response.headers[.init("X-Request-Id")!] == requestId)
                }
            }
            // Each service logged the request under the gateway's id.
            for service in ServiceName.allCases {
                #expect(services.processes[service]!.output.contains("request-id=\(requestId)"), "\(service) log lacks the id")
            }
        }
        await services.stopAll()
    }

    @Test func healthzAnswersWithoutTheBus() async throws {
        // Given no service running at all
        let nowhere = Dictionary(uniqueKeysWithValues: ServiceName.allCases.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        try await gateway(endpoints: nowhere) { app, clients in
            try await app.test(.router) { client in
                try await client.execute(uri: "/healthz", method: .get) { response in
                    #expect(response.status == .ok)
                    #expect(response.headers[.init("X-Request-Id")!] != nil)
                }
                try await client.execute(uri: "/readyz", method: .get) { response in
                    #expect(response.status == .serviceUnavailable)
                    let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                    #expect(body?["unavailable"] as? [String] == ["history", "jobs", "quota"])
                }
            }
        }
    }

    @Test func aRouteWhoseServiceIsDownIs503WithRetryAfterNot504() async throws {
        // Given jobs down (nothing listening on its endpoint) and calls with a 500 ms deadline
        let nowhere = Dictionary(uniqueKeysWithValues: ServiceName.allCases.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        try await gateway(endpoints: nowhere, files: true, extra: ["BUS_TIMEOUT_MS": "500"]) { app, _ in
            try await app.test(.router) { client in
                // When a route that asks jobs is called (the catalogue of effects)
                try await client.execute(uri: "/api/v1/effects", method: .get) { response in
                    // Then it is 503 with Retry-After, as while a process restarts, not the 504 of
                    // a service that was reached and did not answer in time (the chaos checks
                    // allow only the former while a process is down)
                    #expect(response.status == .serviceUnavailable)
                    #expect(response.headers[.retryAfter] == "1")
                    let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                    #expect(body?["code"] as? String == "connection_lost")
                    #expect(body?["service"] as? String == "jobs")
                }
            }
        }
    }

    @Test func unknownRouteIsProblemJSONWithTheRequestId() async throws {
        try await gateway(endpoints: [:]) { app, clients in
            try await app.test(.router) { client in
                try await client.execute(uri: "/no/such/thing", method: .get, headers: [.init("X-Request-Id")!: "mine-1"]) { response in
                    #expect(response.status == .notFound)
                    #expect(response.headers[.contentType] == "application/problem+json")
                    let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                    #expect(body?["status"] as? Int == 404)
                    #expect(body?["requestId"] as? String == "mine-1")
                    #expect(body?["title"] as? String == "Not Found")
                }
            }
        }
    }

    @Test func aKnownPathAskedWithAnotherMethodIs405WithAllow() async throws {
        try await gateway(endpoints: [:], files: true) { app, clients in
            try await app.test(.router) { client in
                // Given paths the gateway serves, asked with a method they do not take
                for (path, method, allowed) in [
                    ("/healthz", HTTPRequest.Method(rawValue: "TRACE")!, "GET"),
                    ("/api/v1/users/me", HTTPRequest.Method.post, "GET"),
                    ("/api/v1/users/me/", HTTPRequest.Method.delete, "GET"),
                    ("/api/v1/uploads/presigned", HTTPRequest.Method.put, "POST"),
                ] {
                    try await client.execute(uri: path, method: method, headers: [.init("X-Device-Id")!: UUID().uuidString]) { response in
                        // Then the answer is 405, saying in `Allow` what the path takes, as problem+json
                        #expect(response.status == .methodNotAllowed, "\(method) \(path)")
                        #expect(response.headers[.allow] == allowed, "\(method) \(path)")
                        #expect(response.headers[.contentType] == "application/problem+json")
                        let body = try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]
                        #expect(body?["status"] as? Int == 405)
                    }
                }
                // And the route the router picks is the one that answers: a constant part wins over
                // a capture (`/api/v1/history/changes` is not `/api/v1/history/:jobId`, which takes DELETE)
                try await client.execute(uri: "/api/v1/history/changes", method: .delete, headers: [.init("X-Device-Id")!: UUID().uuidString]) { response in
                    #expect(response.status == .methodNotAllowed)
                    #expect(response.headers[.allow] == "GET")
                }
                try await client.execute(uri: "/api/v1/history/some-job", method: .put, headers: [.init("X-Device-Id")!: UUID().uuidString]) { response in
                    #expect(response.status == .methodNotAllowed)
                    #expect(response.headers[.allow] == "DELETE, GET")
                }
                // And a path no route has stays 404, whatever the method
                try await client.execute(uri: "/api/v1/users/nobody", method: .init(rawValue: "TRACE")!) { response in
                    #expect(response.status == .notFound)
                    #expect(response.headers[.allow] == nil)
                }
            }
        }
    }
}

@Suite("RFC 3339 dates", .timeLimit(.minutes(5)))
struct RFC3339Tests {
    @Test func everyDateTimeOfTheGrammarParsesAndNothingElse() {
        // RFC 3339 §5.6, and the examples of §5.8
        #expect(RFC3339.date("1985-04-12T23:20:50.52Z")?.timeIntervalSince1970 == 482_196_050.52)
        #expect(RFC3339.date("1996-12-19T16:39:57-08:00")?.timeIntervalSince1970 == 851_042_397)
        #expect(RFC3339.date("1990-12-31T23:59:60Z")?.timeIntervalSince1970 == 662_687_999)
        #expect(abs((RFC3339.date("1937-01-01T12:00:27.87+00:20")?.timeIntervalSince1970 ?? 0) + 1_041_337_172.13) < 1e-6)
        // An offset Foundation's ISO 8601 parser refuses, and Python's datetime takes
        #expect(RFC3339.date("2000-01-27T20:33:13+19:55")?.timeIntervalSince1970 == 948_933_493)
        #expect(RFC3339.date("2024-02-29t00:00:00z")?.timeIntervalSince1970 == 1_709_164_800)
        #expect(RFC3339.date("0000-01-01T00:00:00Z")?.timeIntervalSince1970 == -62_167_219_200)
        for bad in ["", "2026-12-31", "2026-12-31T23:59:59", "2023-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-12-31T24:00:00Z",
                    "2026-12-31T23:59:59.Z", "2026-12-31T23:59:59+0100", "2026-12-31T23:59:59+24:00", "2026-12-31T23:59:59Zjunk", "２０２６-12-31T23:59:59Z"] {
            #expect(RFC3339.date(bad) == nil, "\(bad)")
        }
    }
}
