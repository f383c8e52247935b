import Bus
import Foundation
import Messages
import ServiceKit
import Testing
import ZeroMQ

/// Secure by default off loopback: a service asked to bind an address other machines reach,
/// without CURVE, refuses to start with one line saying why, unless `BUS_ALLOW_PLAINTEXT=1`; with
/// CURVE, it refuses to start without the list of its callers' keys and roles.
@Suite("The bus off loopback", .serialized, .timeLimit(.minutes(5)))
struct BusExposureTests {
    @Test func loopbackIpcAndInprocAreLocalAnythingElseIsNot() {
        for endpoint in ["tcp://127.0.0.1:7101", "tcp://127.0.0.2:1", "tcp://localhost:7101", "tcp://[::1]:7101", "tcp://lo:7101",
                         "ipc:///tmp/quota.sock", "inproc://quota"] {
            #expect(BusSecurity.isLocal(endpoint), "\(endpoint)")
        }
        for endpoint in ["tcp://0.0.0.0:7101", "tcp://*:7101", "tcp://10.1.2.3:7101", "tcp://[::]:7101", "tcp://eth0:7101", "tcp://quota:7101",
                         "tcp://128.0.0.1:1"] {
            #expect(!BusSecurity.isLocal(endpoint), "\(endpoint)")
        }
    }

    func start(_ service: ServiceName, bindVariable: String, endpoint: String, extra: [String: String]) throws -> ServiceProcess {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("exposure-\(UUID().uuidString)")
        var environment = ["DATA_DIR": data.path, service.bindVariable: "tcp://127.0.0.1:\(freePort())", "LOG_LEVEL": "info"]
        environment[bindVariable] = endpoint
        return try ServiceProcess(service.rawValue, environment: environment.merging(extra) { _, new in new })
    }

    @Test func aServiceOnAllInterfacesWithoutCurveRefusesToStartUnlessPlainTextIsAllowed() async throws {
        let port = freePort()
        // Plain text on every interface: refused, with the line that says why
        let refused = try start(.quota, bindVariable: "QUOTA_BIND", endpoint: "tcp://0.0.0.0:\(port)", extra: [:])
        let status = try await refused.waitForExit()
        #expect(status != nil && status != 0)
        #expect(refused.output.contains("QUOTA_BIND=tcp://0.0.0.0:\(port) is reachable from other machines and BUS_CURVE_SECRET is not set"))

        // The operator says the network is private: it serves
        let allowed = try start(.quota, bindVariable: "QUOTA_BIND", endpoint: "tcp://0.0.0.0:\(port)", extra: ["BUS_ALLOW_PLAINTEXT": "1"])
        try await withBusClient(.init(endpoint: "tcp://127.0.0.1:\(port)")) { client in
            _ = try await waitUntilHealthy(client)
        }
        await allowed.stop()

        // With CURVE but no list of callers: refused, since any holder of the server's public
        // key would call as any role
        let keys = try ZMQCurveKeyPair.generate()
        let unlisted = try start(.quota, bindVariable: "QUOTA_BIND", endpoint: "tcp://0.0.0.0:\(port)", extra: ["BUS_CURVE_SECRET": keys.secretKey])
        let unlistedStatus = try await unlisted.waitForExit()
        #expect(unlistedStatus != nil && unlistedStatus != 0)
        #expect(unlisted.output.contains("QUOTA_BIND=tcp://0.0.0.0:\(port) is reachable from other machines and BUS_CURVE_CLIENTS is not set"))

        // With CURVE and its callers listed it serves, and callers need a listed key
        let caller = try ZMQCurveKeyPair.generate()
        let secure = try start(.quota, bindVariable: "QUOTA_BIND", endpoint: "tcp://0.0.0.0:\(port)", extra: [
            "BUS_CURVE_SECRET": keys.secretKey, "BUS_CURVE_CLIENTS": "gateway:\(caller.publicKey)",
        ])
        try await withBusClient(.init(
            endpoint: "tcp://127.0.0.1:\(port)",
            curve: try BusSecurity.clientKeys(Environment(["BUS_CURVE_PUBLIC": keys.publicKey, "BUS_CURVE_KEY": caller.secretKey]))
        )) { curveClient in
            _ = try await waitUntilHealthy(curveClient)
        }
        await secure.stop()
    }

    @Test func jobsRefusesAWorkerEndpointOnTheNetworkWithoutTheListOfItsCallers() async throws {
        let keys = try ZMQCurveKeyPair.generate()
        let refused = try start(.jobs, bindVariable: "JOBS_WORKER_BIND", endpoint: "tcp://0.0.0.0:\(freePort())", extra: ["BUS_CURVE_SECRET": keys.secretKey])
        let status = try await refused.waitForExit(within: .seconds(20))
        #expect(status != nil && status != 0)
        #expect(refused.output.contains("JOBS_WORKER_BIND=tcp://0.0.0.0:") && refused.output.contains("BUS_CURVE_CLIENTS is not set"))
    }

    @Test func jobsRefusesAPlainWorkerEndpointOnTheNetwork() async throws {
        let refused = try start(.jobs, bindVariable: "JOBS_WORKER_BIND", endpoint: "tcp://0.0.0.0:\(freePort())", extra: [:])
        let status = try await refused.waitForExit(within: .seconds(20))
        #expect(status != nil && status != 0)
        #expect(refused.output.contains("JOBS_WORKER_BIND=tcp://0.0.0.0:"))
    }
}
