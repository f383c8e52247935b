import AsyncHTTPClient
import Foundation
import JWTKit
import NIOCore
import NIOHTTP1

/// An answer from the gateway.
struct Answer: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: [UInt8]

    /// The body as a JSON object, if it is one.
    var object: [String: any Sendable]? {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: any Sendable]
    }

    /// The problem's `code`, else its `type`, of a problem+json body.
    var problem: String? {
        guard headers.first(name: "Content-Type")?.contains("problem+json") == true, let object else { return nil }
        return (object["code"] as? String) ?? (object["type"] as? String)
    }
}

/// A virtual user's credentials: a signed token, or a guest's device id.
struct Credentials: Sendable {
    var userId: String
    var header: (name: String, value: String)
    var isGuest: Bool
}

/// Calls the gateway and records every call in the `Recorder`: latency from the planned start,
/// status (0 when no answer came), problem type. Each session has its own (`forSession()`): its
/// own few connections, as a phone has, so that one session's broken connections (a gateway
/// killed under it) are not every session's.
final class GatewayClient: Sendable {
    let base: String
    let http: HTTPClient
    let recorder: Recorder
    private let keys: JWTKeyCollection
    let adminToken: String
    /// The largest body read from an answer.
    static let maxBody = 32 << 20

    struct Claims: JWTPayload {
        var sub: SubjectClaim
        var exp: ExpirationClaim
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    convenience init(base: String, jwtSecret: String, adminToken: String, recorder: Recorder, connections: Int) async {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: jwtSecret), digestAlgorithm: .sha256)
        self.init(base: base.hasSuffix("/") ? String(base.dropLast()) : base, keys: keys, adminToken: adminToken, recorder: recorder, connections: connections)
    }

    private init(base: String, keys: JWTKeyCollection, adminToken: String, recorder: Recorder, connections: Int) {
        self.base = base
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = connections
        configuration.timeout = .init(connect: .seconds(5), read: .seconds(60))
        // Idle connections are closed here well before the server's side does (the gateway's
        // HTTP_IDLE_TIMEOUT_S is 60 s, as this pool's default was, and the hosts' HAProxy closes
        // idle clients after 30 s): with both at 60 s, a request sent on a connection the server
        // was just closing got no answer (`remoteConnectionClosed`, seen once in the hosts' fault
        // run), a failure of the load test's own making. The same race between HAProxy and the
        // gateways is why that HAProxy does not share idle connections (deploy/hosts/haproxy.cfg).
        configuration.connectionPool = .init(idleTimeout: .seconds(20))
        configuration.decompression = .disabled
        http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        self.recorder = recorder
        self.adminToken = adminToken
        self.keys = keys
    }

    /// A client for one session: same gateway, keys and recorder, its own connections (at most
    /// `connections`). Shut it down when the session ends.
    func forSession(connections: Int = 4) -> GatewayClient {
        GatewayClient(base: base, keys: keys, adminToken: adminToken, recorder: recorder, connections: connections)
    }

    func shutdown() async {
        try? await http.shutdown()
    }

    /// A signed-in user's credentials (a token valid for a day).
    func user(_ id: String) async throws -> Credentials {
        let token = try await keys.sign(Claims(sub: .init(value: id), exp: .init(value: Date().addingTimeInterval(86_400))))
        return Credentials(userId: id, header: ("Authorization", "Bearer \(token)"), isGuest: false)
    }

    /// A guest's credentials.
    static func guest() -> Credentials {
        let device = UUID().uuidString.lowercased()
        return Credentials(userId: "device:\(device)", header: ("X-Device-Id", device), isGuest: true)
    }

    /// The URL of `pathOrURL` (a path on the gateway, or an absolute URL it gave).
    func url(_ pathOrURL: String) -> String {
        pathOrURL.hasPrefix("http://") || pathOrURL.hasPrefix("https://") ? pathOrURL : base + pathOrURL
    }

    /// Sends one request, planned to start at `planned` (it waits until then), and records it
    /// under `route` unless `record` is false. Nil when no answer came.
    func send(
        _ route: String, _ method: HTTPMethod, _ path: String, as user: Credentials? = nil, admin: Bool = false,
        headers extra: [(String, String)] = [], json: [String: any Sendable]? = nil, body: [UInt8]? = nil,
        planned: ContinuousClock.Instant = .now, timeout: Duration = .seconds(30), record: Bool = true
    ) async -> Answer? {
        if planned > .now { try? await Task.sleep(until: planned, clock: .continuous) }
        var request = HTTPClientRequest(url: url(path))
        request.method = method
        if let user { request.headers.add(name: user.header.name, value: user.header.value) }
        if admin { request.headers.add(name: "Authorization", value: "Bearer \(adminToken)") }
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        if let json, let data = try? JSONSerialization.data(withJSONObject: json) {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: data))
        } else if let body {
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        do {
            let response = try await http.execute(request, timeout: .init(timeout))
            let bytes = try await response.body.collect(upTo: Self.maxBody)
            let answer = Answer(status: Int(response.status.code), headers: response.headers, body: Array(bytes.readableBytesView))
            if record {
                recorder.record(route: route, status: answer.status, planned: planned, problem: answer.problem,
                                detail: String(decoding: answer.body.prefix(300), as: UTF8.self))
            }
            return answer
        } catch {
            // A session stopped at the end of the drain is not a failed request.
            if Task.isCancelled { return nil }
            if record { recorder.record(route: route, status: 0, planned: planned, problem: "no_answer", detail: "\(error)") }
            return nil
        }
    }

    /// Opens a job's event stream and reads it until the job ends, `limit` passes or the stream
    /// breaks. The latency recorded is the time to the stream's head. Returns the last status
    /// seen, nil if the stream did not tell.
    func follow(events jobId: String, as user: Credentials, planned: ContinuousClock.Instant, limit: Duration) async -> String? {
        if planned > .now { try? await Task.sleep(until: planned, clock: .continuous) }
        let route = "GET /api/v1/jobs/{id}/events"
        var request = HTTPClientRequest(url: url("/api/v1/jobs/\(jobId)/events"))
        request.headers.add(name: user.header.name, value: user.header.value)
        request.headers.add(name: "Accept", value: "text/event-stream")
        let deadline = ContinuousClock.now.advanced(by: limit)
        do {
            let response = try await http.execute(request, deadline: .now() + .nanoseconds(Int64(limit / .nanoseconds(1))))
            guard response.status == .ok else {
                let bytes = try await response.body.collect(upTo: 1 << 20)
                let answer = Answer(status: Int(response.status.code), headers: response.headers, body: Array(bytes.readableBytesView))
                recorder.record(route: route, status: answer.status, planned: planned, problem: answer.problem)
                return nil
            }
            recorder.record(route: route, status: 200, planned: planned, problem: nil)
            var buffer = ""
            var last: String?
            // A stream that breaks after its head is not a failed request: the caller polls.
            do {
            for try await chunk in response.body {
                buffer += String(buffer: chunk)
                while let end = buffer.range(of: "\n\n") {
                    let event = buffer[..<end.lowerBound]
                    buffer = String(buffer[end.upperBound...])
                    if event.contains("event: gone") { return "gone" }
                    if let line = event.split(separator: "\n").first(where: { $0.hasPrefix("data: ") }),
                       let object = (try? JSONSerialization.jsonObject(with: Data(line.dropFirst(6).utf8))) as? [String: Any],
                       let status = object["status"] as? String {
                        last = status
                        if ["completed", "failed", "cancelled"].contains(status) { return status }
                    }
                }
                if ContinuousClock.now > deadline || buffer.utf8.count > 1 << 20 { return last }
            }
            } catch {
                return last
            }
            return last
        } catch {
            // The session's own deadline cut the request: not the server's failure.
            if ContinuousClock.now < deadline {
                recorder.record(route: route, status: 0, planned: planned, problem: "no_answer", detail: "\(error)")
            }
            return nil
        }
    }
}
