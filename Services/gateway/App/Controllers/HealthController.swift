import Bus
import Foundation
import Hummingbird
import Messages
import ServiceKit

/// `GET /healthz` (the process is alive) and `GET /readyz` (every service answers on the bus).
struct HealthController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let readinessTimeout: Duration

    func addRoutes(to router: Router<Context>) {
        router.get("/healthz") { _, _ in
            // The same bytes every time: encoded once (JSONEncoder was 8 % of the gateway's
            // time under a load of health checks).
            Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: Self.healthy))
        }
        router.get("/readyz") { _, _ in
            try await readiness()
        }
    }

    /// `/healthz`'s body, `{"status":"ok"}`, as `JSONResponse` would write it.
    static var healthy: ByteBuffer { ByteBuffer(string: #"{"status":"ok"}"#) }

    /// What one service said, or why it said nothing.
    struct ServiceStatus: Encodable, Sendable {
        var status: String
        var version: String?
        var uptimeSeconds: Double?
        var pid: Int32?
        var error: String?
    }

    /// Asks every service's `health` at once, each with the readiness deadline. A service with
    /// replicas is asked once per replica at most, until one answers: the calls are spread over
    /// the replicas, so one that is cut off but not yet seen gone (a partition is found by the
    /// bus's heartbeats, in seconds) does not make the gateway unready while another serves.
    func readiness() async throws -> Response {
        let statuses = await withTaskGroup(of: (ServiceName, ServiceStatus).self) { group in
            for service in ServiceName.allCases {
                group.addTask {
                    let client = clients.client(for: service)
                    var failure: BusError?
                    for _ in 0..<max(1, client.configuration.endpoints.count) {
                        do throws(BusError) {
                            let report = try await client.call(Health.check, Empty(), timeout: readinessTimeout)
                            return (service, ServiceStatus(status: "up", version: report.version, uptimeSeconds: report.uptimeSeconds, pid: report.pid))
                        } catch {
                            failure = error
                        }
                    }
                    return (service, ServiceStatus(status: "down", error: failure.map { "\($0.code.rawValue): \($0.message)" }))
                }
            }
            var statuses: [String: ServiceStatus] = [:]
            for await (service, status) in group { statuses[service.rawValue] = status }
            return statuses
        }
        let down = statuses.filter { $0.value.status != "up" }.keys.sorted()
        guard down.isEmpty else {
            throw Problem(
                .serviceUnavailable,
                title: "Not ready",
                detail: "No answer from: \(down.joined(separator: ", "))",
                headers: [.retryAfter: "1"],
                extensions: [
                    "unavailable": .strings(down),
                    "services": .object(statuses.mapValues { ProblemValue.string($0.status) }),
                ]
            )
        }
        return try JSONResponse.make(.ok, Readiness(status: "ready", services: statuses))
    }

    struct Readiness: Encodable {
        var status: String
        var services: [String: ServiceStatus]
    }
}
