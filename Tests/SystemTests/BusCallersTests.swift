import Bus
import Foundation
import Messages
import ServiceKit
import Testing
import ZeroMQ

/// Callers known by key, limited to their role (real service processes, CURVE over tcp): each
/// service admits the public keys of `BUS_CURVE_CLIENTS`, each with a role; a method outside the
/// caller's role answers `forbidden` and changes nothing; an unknown key gets no connection.
@Suite("Bus callers by key and role", .serialized, .timeLimit(.minutes(5)))
struct BusCallersTests {
    struct Keys {
        let server = try! ZMQCurveKeyPair.generate()
        let gateway = try! ZMQCurveKeyPair.generate()
        let newGateway = try! ZMQCurveKeyPair.generate()
        let worker = try! ZMQCurveKeyPair.generate()
        let history = try! ZMQCurveKeyPair.generate()
        let stranger = try! ZMQCurveKeyPair.generate()
    }

    /// A client of `endpoint` calling with `key`.
    static func client(_ endpoint: String, server: ZMQCurveKeyPair, key: ZMQCurveKeyPair, timeout: Duration = .seconds(3)) throws -> BusClient.Configuration {
        let curve = try BusSecurity.clientKeys(Environment(["BUS_CURVE_PUBLIC": server.publicKey, "BUS_CURVE_KEY": key.secretKey]))
        return .init(endpoint: endpoint, defaultTimeout: timeout, curve: curve)
    }

    /// What a caller without a connection hears: its own deadline, its client's word that the
    /// service cannot be reached (the handshake was refused), or, caught between a refused
    /// handshake and libzmq's reconnect, no connection to queue on (`overloaded` at once).
    static let unanswered: Set<BusError.Code> = [.timeout, .unavailable, .connectionLost, .overloaded]

    static func code(_ body: () async throws -> Void) async -> BusError.Code? {
        do { try await body(); return nil } catch let error as BusError { return error.code } catch { return BusError.Code("other") }
    }

    @Test func aWorkersKeyIsRefusedWhatIsNotItsAndAStrangersKeyGetsNoConnection() async throws {
        let keys = Keys()
        let services = try RunningServices(only: [])
        let allowed = "gateway:\(keys.gateway.publicKey), worker:\(keys.worker.publicKey), history:\(keys.history.publicKey)"
        let curve = ["BUS_CURVE_SECRET": keys.server.secretKey, "BUS_CURVE_PUBLIC": keys.server.publicKey, "BUS_CURVE_CLIENTS": allowed]
        try services.start(.quota, extra: curve)
        try services.start(.jobs, extra: curve)
        try services.start(.history, extra: curve)
        try await withBusClients([
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.gateway),
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.worker),
            try Self.client(services.endpoints[.jobs]!, server: keys.server, key: keys.worker),
            try Self.client(services.endpoints[.history]!, server: keys.server, key: keys.worker),
            try Self.client(services.endpoints[.jobs]!, server: keys.server, key: keys.history),
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.history),
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.stranger, timeout: .seconds(1)),
        ]) { clients in
        let (gatewayQuota, workerQuota, workerJobs, workerHistory) = (clients[0], clients[1], clients[2], clients[3])
        let (historyJobs, historyQuota, stranger) = (clients[4], clients[5], clients[6])
        _ = try await waitUntilHealthy(gatewayQuota)

        // A worker's key: quota's plan change, history's delete and jobs' reads are forbidden
        #expect(await Self.code { _ = try await workerQuota.call(Quota.setPlan, SetPlan(userId: "mallory", plan: "pro")) } == .forbidden)
        #expect(await Self.code { _ = try await workerJobs.call(Jobs.get, JobReference(jobId: "j", userId: "alice")) } == .forbidden)
        #expect(await Self.code { _ = try await workerHistory.call(History.delete, HistoryItemReference(userId: "alice", jobId: "j")) } == .forbidden)
        // Nothing changed: mallory is still on the free plan
        #expect(try await gatewayQuota.call(Quota.status, UserReference(userId: "mallory")).plan == "free")
        // The gateway's key may; history's key may ask jobs to purge (its flow), not to change plans
        #expect(try await gatewayQuota.call(Quota.setPlan, SetPlan(userId: "bob", plan: "pro")).plan == "pro")
        #expect(try await historyJobs.call(Jobs.purge, JobReference(jobId: "none", userId: "bob")).existed == false)
        #expect(await Self.code { _ = try await historyQuota.call(Quota.setPlan, SetPlan(userId: "bob", plan: "free")) } == .forbidden)

        // A key nobody listed: no connection, so no answer; the refusal is counted
        let strangerCode = await Self.code { _ = try await stranger.call(Quota.status, UserReference(userId: "bob")) }
        #expect(Self.unanswered.contains(strangerCode ?? .init("answered")), "\(String(describing: strangerCode))")
        let scrape = try await gatewayQuota.call(Telemetry.scrape, Empty())
        #expect(scrape.sections.map(\.text).joined().contains("bus_callers_refused_total"))
        #expect(services.processes[.quota]!.output.contains("refused a bus caller with an unknown key"))

        }
        await services.stopAll()
    }

    @Test func duringARotationBothKeysAreServedAndAfterItTheOldOneIsRefused() async throws {
        let keys = Keys()
        let services = try RunningServices(only: [])
        let base = ["BUS_CURVE_SECRET": keys.server.secretKey, "BUS_CURVE_PUBLIC": keys.server.publicKey]
        try services.start(.quota, extra: base.merging(["BUS_CURVE_CLIENTS": "gateway:\(keys.gateway.publicKey),gateway:\(keys.newGateway.publicKey)"]) { _, new in new })
        try await withBusClients([
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.gateway, timeout: .seconds(1)),
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.newGateway, timeout: .seconds(1)),
        ]) { clients in
            for client in clients { _ = try await waitUntilHealthy(client) }
        }
        // The old key is removed: its callers are refused, the new one's served
        await services.stop(.quota)
        try services.start(.quota, extra: base.merging(["BUS_CURVE_CLIENTS": "gateway:\(keys.newGateway.publicKey)"]) { _, new in new })
        try await withBusClients([
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.newGateway, timeout: .seconds(1)),
            try Self.client(services.endpoints[.quota]!, server: keys.server, key: keys.gateway, timeout: .seconds(1)),
        ]) { clients in
        let (renewed, retired) = (clients[0], clients[1])
        _ = try await waitUntilHealthy(renewed)
        let retiredCode = await Self.code { _ = try await retired.call(Quota.status, UserReference(userId: "bob")) }
        #expect(Self.unanswered.contains(retiredCode ?? .init("answered")), "\(String(describing: retiredCode))")
        }
        await services.stopAll()
    }
}

/// `photoedit keys` makes keys libzmq takes, and a deployment runs on them.
@Suite("Bus keys by command", .serialized, .timeLimit(.minutes(5)))
struct BusKeysCommandTests {
    static func settings(_ text: String) -> [String: String] {
        Dictionary(text.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { line -> (String, String)? in
            let parts = line.split(separator: "=", maxSplits: 1)
            return parts.count == 2 ? (String(parts[0]), String(parts[1]).trimmingCharacters(in: CharacterSet(charactersIn: "'"))) : nil
        }, uniquingKeysWith: { _, last in last })
    }

    @Test func theKeysAreLibzmqsAndAServiceRunsOnThemAndARotationAddsAKey() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("keys-\(UUID().uuidString).env")
        let made = try await CommandLineClientTests.photoedit(["keys", "--output", file.path])
        #expect(made.status == 0, "\(made.output)")
        var keys = Self.settings(try String(contentsOf: file, encoding: .utf8))
        #expect((try FileManager.default.attributesOfItem(atPath: file.path)[.posixPermissions] as? Int) == 0o600)
        // Each secret's public half (by libzmq) is the one listed
        #expect(ZMQCurveKeyPair.publicKey(ofSecret: keys["BUS_CURVE_SECRET"] ?? "") == keys["BUS_CURVE_PUBLIC"])
        let listed = keys["BUS_CURVE_CLIENTS"] ?? ""
        for role in ["gateway", "quota", "jobs", "history", "worker", "operator"] {
            let secret = try #require(keys["\(role.uppercased())_BUS_CURVE_KEY"])
            let publicKey = try #require(ZMQCurveKeyPair.publicKey(ofSecret: secret))
            #expect(listed.contains("\(role):\(publicKey)"))
        }
        // quota runs on them; the gateway's key is served, with its role
        let services = try RunningServices(only: [])
        try services.start(.quota, extra: [
            "BUS_CURVE_SECRET": keys["BUS_CURVE_SECRET"]!, "BUS_CURVE_PUBLIC": keys["BUS_CURVE_PUBLIC"]!,
            "BUS_CURVE_CLIENTS": listed, "BUS_CURVE_KEY": keys["QUOTA_BUS_CURVE_KEY"]!,
        ])
        let curve = try BusSecurity.clientKeys(Environment(["BUS_CURVE_PUBLIC": keys["BUS_CURVE_PUBLIC"]!, "BUS_CURVE_KEY": keys["GATEWAY_BUS_CURVE_KEY"]!]))
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!, defaultTimeout: .seconds(3), curve: curve)) { gateway in
            _ = try await waitUntilHealthy(gateway)
            #expect(try await gateway.call(Quota.setPlan, SetPlan(userId: "bob", plan: "pro")).plan == "pro")
        }
        await services.stopAll()
        // A rotation of the gateway's key: the new one is the gateway's, the old one still listed
        let rotated = try await CommandLineClientTests.photoedit(["keys", "--output", file.path, "--rotate", "gateway"])
        #expect(rotated.status == 0, "\(rotated.output)")
        let before = keys
        keys = Self.settings(try String(contentsOf: file, encoding: .utf8))
        let newPublic = try #require(ZMQCurveKeyPair.publicKey(ofSecret: keys["GATEWAY_BUS_CURVE_KEY"] ?? ""))
        let oldPublic = try #require(ZMQCurveKeyPair.publicKey(ofSecret: before["GATEWAY_BUS_CURVE_KEY"] ?? ""))
        #expect(newPublic != oldPublic && keys["BUS_CURVE_CLIENTS"]!.contains("gateway:\(newPublic)") && keys["BUS_CURVE_CLIENTS"]!.contains("gateway:\(oldPublic)"))
        try? FileManager.default.removeItem(at: file)
    }

    @Test func eachHostGetsAFileOfItsRoleOnlyAndTheServicesRunOnTheirs() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("host-keys-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let deployment = folder.appendingPathComponent("deployment.env").path
        #expect(try await CommandLineClientTests.photoedit(["keys", "--output", deployment]).status == 0)
        let all = Self.settings(try String(contentsOfFile: deployment, encoding: .utf8))
        var hosts: [String: [String: String]] = [:]
        for role in ["worker", "gateway", "quota"] {
            let file = folder.appendingPathComponent("\(role).env").path
            let cut = try await CommandLineClientTests.photoedit(["keys", "--from", deployment, "--role", role, "--out", file])
            #expect(cut.status == 0, "\(cut.output)")
            #expect((try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int) == 0o600)
            hosts[role] = Self.settings(try String(contentsOfFile: file, encoding: .utf8))
        }
        // A worker host holds its own key and the server's public key, nothing else
        #expect(hosts["worker"] == ["BUS_CURVE_PUBLIC": all["BUS_CURVE_PUBLIC"]!, "BUS_CURVE_KEY": all["WORKER_BUS_CURVE_KEY"]!])
        #expect(hosts["gateway"] == ["BUS_CURVE_PUBLIC": all["BUS_CURVE_PUBLIC"]!, "BUS_CURVE_KEY": all["GATEWAY_BUS_CURVE_KEY"]!])
        // A service's host also serves: the server's secret key and the list of callers
        #expect(hosts["quota"] == [
            "BUS_CURVE_PUBLIC": all["BUS_CURVE_PUBLIC"]!, "BUS_CURVE_KEY": all["QUOTA_BUS_CURVE_KEY"]!,
            "BUS_CURVE_SECRET": all["BUS_CURVE_SECRET"]!, "BUS_CURVE_CLIENTS": all["BUS_CURVE_CLIENTS"]!,
        ])
        // An unknown role, or no deployment file: refused
        #expect(try await CommandLineClientTests.photoedit(["keys", "--from", deployment, "--role", "admin"]).status != 0)
        #expect(try await CommandLineClientTests.photoedit(["keys", "--from", folder.appendingPathComponent("none").path, "--role", "worker"]).status != 0)
        // And quota serves on its host's file, to the gateway on the gateway's
        let services = try RunningServices(only: [])
        try services.start(.quota, extra: hosts["quota"]!)
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!, defaultTimeout: .seconds(3), curve: try BusSecurity.clientKeys(Environment(hosts["gateway"]!)))) { gateway in
            _ = try await waitUntilHealthy(gateway)
        }
        await services.stopAll()
    }

    @Test func keysAreReadFromFilesAndAnUnreadableOneStopsTheServiceNamingIt() async throws {
        // Given the server's secret key and the callers' list in files (as Docker and Kubernetes
        // mount secrets), the variable itself empty as compose passes an unset one
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("key-files-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let server = try ZMQCurveKeyPair.generate(), gateway = try ZMQCurveKeyPair.generate()
        let secretFile = folder.appendingPathComponent("secret").path, clientsFile = folder.appendingPathComponent("clients").path
        try Data((server.secretKey + "\n").utf8).write(to: URL(fileURLWithPath: secretFile))
        try Data("gateway:\(gateway.publicKey)\n".utf8).write(to: URL(fileURLWithPath: clientsFile))
        // When quota serves on every interface from them (which needs both)
        let port = freePort()
        let data = folder.appendingPathComponent("data").path
        let quota = try ServiceProcess("quota", environment: [
            "QUOTA_BIND": "tcp://0.0.0.0:\(port)", "DATA_DIR": data, "BUS_CURVE_SECRET": "", "BUS_CURVE_SECRET_FILE": secretFile,
            "BUS_CURVE_CLIENTS_FILE": clientsFile,
        ])
        // Then the listed gateway key is served
        let curve = try BusSecurity.clientKeys(Environment(["BUS_CURVE_PUBLIC": server.publicKey, "BUS_CURVE_KEY": gateway.secretKey]))
        try await withBusClient(.init(endpoint: "tcp://127.0.0.1:\(port)", defaultTimeout: .seconds(3), curve: curve)) { client in
            _ = try await waitUntilHealthy(client)
        }
        await quota.stop()
        // And a file that cannot be read stops the service at start, naming its variable
        let broken = try ServiceProcess("quota", environment: [
            "QUOTA_BIND": "tcp://127.0.0.1:\(freePort())", "DATA_DIR": data, "BUS_CURVE_SECRET_FILE": folder.appendingPathComponent("missing").path,
        ])
        let status = try await broken.waitForExit()
        #expect(status != nil && status != 0)
        #expect(broken.output.contains("BUS_CURVE_SECRET_FILE"), "\(broken.output)")
    }
}
