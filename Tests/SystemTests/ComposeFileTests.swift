import Foundation
import GatewayApp
import HistoryService
import JobsService
import QuotaService
import WorkerKit
import ServiceKit
import Testing
import Yams

@Suite("compose.yaml", .timeLimit(.minutes(5)))
struct ComposeFileTests {
    /// The repository's root, found from this file's path.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func services() throws -> [String: [String: Any]] {
        let text = try String(contentsOf: Self.root.appendingPathComponent("compose.yaml"), encoding: .utf8)
        let document = try Yams.load(yaml: text) as? [String: Any]
        return try #require(document?["services"] as? [String: [String: Any]])
    }

    func environment(of service: [String: Any]) -> [String: String] {
        if let map = service["environment"] as? [String: Any] {
            return map.mapValues { "\($0)" }
        }
        if let list = service["environment"] as? [String] {
            return Dictionary(list.map { entry in
                let parts = entry.split(separator: "=", maxSplits: 1).map(String.init)
                return (parts[0], parts.count > 1 ? parts[1] : "")
            }, uniquingKeysWith: { first, _ in first })
        }
        return [:]
    }

    @Test func everyExecutableIsAServiceWithTheEnvironmentItReads() throws {
        let services = try services()
        var expected: [String: [String]] = ["gateway": GatewayConfiguration.environmentKeys]
        for service in ServiceName.allCases {
            expected[service.rawValue] = ServiceConfiguration.environmentKeys(for: service)
        }
        expected["quota"]! += QuotaConfiguration.environmentKeys
        expected["jobs"]! += JobsConfiguration.environmentKeys
        expected["history"]! += HistoryConfiguration.environmentKeys
        expected["worker"] = WorkerConfiguration.environmentKeys
        for (name, keys) in expected {
            let service = try #require(services[name], "compose.yaml has no service \(name)")
            let command = (service["command"] as? [String])?.first ?? service["command"] as? String ?? ""
            #expect(command.hasPrefix(name) || command.contains("/\(name)"), "\(name) runs \(command)")
            let environment = environment(of: service)
            for key in keys {
                #expect(environment[key] != nil, "\(name) lacks \(key)")
            }
        }
    }

    @Test func servicesBindWhereTheGatewayLooks() throws {
        let services = try services()
        let gateway = environment(of: try #require(services["gateway"]))
        for service in ServiceName.allCases {
            let bound = environment(of: try #require(services[service.rawValue]))[service.bindVariable] ?? ""
            // (`${QUOTA_ENDPOINTS:-tcp://quota:7101}`: the default, without the replicas profile)
            var dialled = gateway[service.endpointVariable] ?? ""
            if dialled.hasPrefix("${"), let marker = dialled.range(of: ":-") { dialled = String(dialled[marker.upperBound...].dropLast()) }
            // The gateway dials the service's host name on the port the service binds.
            #expect(dialled == "tcp://\(service.rawValue):\(bound.split(separator: ":").last ?? "")")
        }
        #expect((services["gateway"]?["ports"] as? [Any])?.isEmpty == false)
    }

    @Test func workersAreTheirOwnServiceWithNoBlobVolumeAndNoStoreCredentials() throws {
        let services = try services()
        let worker = try #require(services["worker"])
        let gateway = try #require(services["gateway"])
        let workerVolumes = Set((worker["volumes"] as? [String] ?? []).compactMap { $0.split(separator: ":").first.map(String.init) })
        let gatewayVolumes = Set((gateway["volumes"] as? [String] ?? []).compactMap { $0.split(separator: ":").first.map(String.init) })
        #expect(!workerVolumes.contains("blobs") && gatewayVolumes.contains("blobs"))
        let workerEnvironment = environment(of: worker)
        for secret in ["AWS_SECRET_ACCESS_KEY", "URL_SIGNING_SECRET", "BLOB_DIR"] { #expect(workerEnvironment[secret] == nil, "a worker holds \(secret)") }
        #expect(worker["ports"] == nil, "a scaled service cannot publish a fixed port")
        #expect(worker["container_name"] == nil, "a scaled service cannot have a fixed name")
    }

    @Test func eachDatabaseServiceHasItsOwnVolume() throws {
        let services = try services()
        var volumes: Set<String> = []
        for service in ServiceName.allCases {
            let mounts = try #require(services[service.rawValue]?["volumes"] as? [String], "\(service) has no volume")
            let volume = try #require(mounts.first?.split(separator: ":").first.map(String.init))
            volumes.insert(volume)
        }
        #expect(volumes.count == ServiceName.allCases.count)
    }
}
