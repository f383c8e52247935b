import Foundation
import Testing

/// The gateway process's `/metrics`.
@Suite("Metrics", .serialized)
struct MetricsTests {
    static func get(_ path: String, port: Int, headers: String = "") -> String {
        guard let connection = try? RawConnection(port: port, timeout: 5) else { return "" }
        connection.send("GET \(path) HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\(headers)\r\n")
        return connection.read(until: "\u{0}")
    }

    /// Every line of a Prometheus text exposition is a comment or a well-formed sample.
    static func parsesStrictly(_ body: String) -> Bool {
        let sample = /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? (-?[0-9.]+([eE][+-]?[0-9]+)?|NaN|\+Inf|-Inf)$/
        return body.split(separator: "\n").allSatisfy { line in
            line.hasPrefix("# HELP ") || line.hasPrefix("# TYPE ") || line.wholeMatch(of: sample) != nil
        }
    }

    /// The value of the `hb_requests` sample of `route` with `status`.
    static func requests(_ body: String, route: String, status: Int) -> Int {
        body.split(separator: "\n").first { $0.hasPrefix("hb_requests{") && $0.contains(#"http_route="\#(route)""#) && $0.contains(#"http_response_status_code="\#(status)""#) }
            .flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
    }

    @Test func theGatewaysCountersMoveAndTheExpositionParses() async throws {
        let system = try await JobSystem(workers: 0)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        let device = "X-Device-Id: \(UUID().uuidString)\r\n"
        for _ in 0..<3 { #expect(Self.get("/api/v1/users/me", port: port, headers: device).hasPrefix("HTTP/1.1 200")) }
        #expect(Self.get("/api/v1/users/me", port: port).hasPrefix("HTTP/1.1 401"))
        var body = ""
        try await waitUntil {
            body = Self.get("/metrics", port: port)
            return Self.requests(body, route: "/api/v1/users/me", status: 200) >= 3
        }
        let head = body.components(separatedBy: "\r\n\r\n").first ?? ""
        let exposition = body.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        #expect(head.contains("text/plain; version=0.0.4"))
        #expect(Self.parsesStrictly(exposition), "\(exposition.prefix(2000))")
        #expect(Self.requests(exposition, route: "/api/v1/users/me", status: 401) == 1)
        #expect(exposition.contains("http_server_request_duration_bucket") && exposition.contains("http_server_active_requests"))
        // One more request moves its counter by one
        let before = Self.requests(exposition, route: "/api/v1/users/me", status: 200)
        _ = Self.get("/api/v1/users/me", port: port, headers: device)
        try await waitUntil { Self.requests(Self.get("/metrics", port: port), route: "/api/v1/users/me", status: 200) == before + 1 }
        await gateway.stop()
        await system.stop()
    }
}
