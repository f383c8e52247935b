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

    func services(_ file: String = "compose.yaml") throws -> [String: [String: Any]] {
        let text = try String(contentsOf: Self.root.appendingPathComponent(file), encoding: .utf8)
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

    /// The bus is offered with CURVE only: every process takes its key and the services their
    /// allow-list from the keys file, none may bind in plain text.
    @Test func theBusIsOfferedWithCurveAndRolesOnly() throws {
        let services = try services()
        for name in ["gateway", "quota", "history", "jobs", "worker"] {
            let environment = environment(of: try #require(services[name]))
            #expect(environment["BUS_CURVE_KEY"]?.hasPrefix("${\(name.uppercased())_BUS_CURVE_KEY:-${BUS_CURVE_KEY:?") == true, "\(name)")
            #expect(environment["BUS_CURVE_PUBLIC"]?.hasPrefix("${BUS_CURVE_PUBLIC:?") == true, "\(name)")
            if ServiceName(rawValue: name) != nil {
                #expect(environment["BUS_CURVE_SECRET"]?.hasPrefix("${BUS_CURVE_SECRET:?") == true, "\(name)")
                #expect(environment["BUS_CURVE_CLIENTS"]?.hasPrefix("${BUS_CURVE_CLIENTS:?") == true, "\(name)")
                #expect(environment["BUS_ALLOW_PLAINTEXT"] == "0", "\(name)")
            }
        }
    }

    /// deploy/hosts: one file per kind of host. The gateway and service hosts extend compose.yaml's
    /// services on the host's network, listening on HOST_ADDRESS; the worker host's file holds the
    /// worker's whole configuration and no secret but its key; hosts.env.example names only
    /// variables something reads.
    @Test func theHostFilesRunComposeServicesOnTheirHostsAddress() throws {
        let base = try services()
        let gateway = try #require(try services("deploy/hosts/gateway-host.yaml")["gateway"])
        let servicesHost = try services("deploy/hosts/service-host.yaml")
        let hosted = [("gateway", gateway)] + ServiceName.allCases.map { ($0.rawValue, servicesHost[$0.rawValue] ?? [:]) }
        for (name, service) in hosted {
            let extends = try #require(service["extends"] as? [String: Any], "\(name) extends nothing")
            #expect(extends["file"] as? String == "../../compose.yaml" && extends["service"] as? String == name)
            #expect(base[name] != nil)
            #expect(service["network_mode"] as? String == "host", "\(name)")
        }
        #expect(environment(of: gateway)["GATEWAY_HOST"]?.hasPrefix("${HOST_ADDRESS:?") == true)
        for service in ServiceName.allCases {
            let bound = environment(of: try #require(servicesHost[service.rawValue]))[service.bindVariable] ?? ""
            #expect(bound.hasPrefix("tcp://${HOST_ADDRESS:?"), "\(service): \(bound)")
        }
        let worker = environment(of: try #require(try services("deploy/hosts/worker-host.yaml")["worker"]))
        for key in WorkerConfiguration.environmentKeys { #expect(worker[key] != nil, "the worker host lacks \(key)") }
        for secret in ["AWS_SECRET_ACCESS_KEY", "URL_SIGNING_SECRET", "JWT_SECRET", "BUS_CURVE_SECRET"] { #expect(worker[secret] == nil, "a worker host holds \(secret)") }
        let example = try String(contentsOf: Self.root.appendingPathComponent("deploy/hosts/hosts.env.example"), encoding: .utf8)
        let named = example.split(separator: "\n").filter { !$0.hasPrefix("#") && $0.contains("=") }.map { String($0.split(separator: "=")[0]) }
        let read = Set(GatewayConfiguration.environmentKeys + ServiceName.allCases.flatMap { ServiceConfiguration.environmentKeys(for: $0) }
            + QuotaConfiguration.environmentKeys + JobsConfiguration.environmentKeys + HistoryConfiguration.environmentKeys + WorkerConfiguration.environmentKeys)
        let text = try String(contentsOf: Self.root.appendingPathComponent("compose.yaml"), encoding: .utf8)
            + String(contentsOf: Self.root.appendingPathComponent("deploy/hosts/edge-host.yaml"), encoding: .utf8)
        #expect(!named.isEmpty)
        for variable in named { #expect(read.contains(variable) || text.contains("${\(variable)"), "hosts.env.example names \(variable), which nothing reads") }
    }
}
