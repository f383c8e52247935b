import Bus
import GatewayApp
import Messages
import ServiceKit
import Testing
import WorkerKit

/// The settings every process shares are read by one parser each (`Environment.logLevel`,
/// `Environment.busEncoding`): every process takes the same values, and a malformed one stops
/// each of them naming the variable.
@Suite("Shared settings")
struct ConfigurationTests {
    static func configurations(_ values: [String: String]) -> [() throws -> Void] {
        let environment = Environment(values)
        return [
            { _ = try ServiceConfiguration(service: .quota, environment: environment) },
            { _ = try GatewayConfiguration(environment: environment) },
            { _ = try WorkerConfiguration(environment: environment) },
        ]
    }

    @Test func everyProcessReadsTheSameLogLevelAndBusEncoding() throws {
        let environment = Environment(["LOG_LEVEL": "DEBUG", "BUS_ENCODING": "Json"])
        let service = try ServiceConfiguration(service: .history, environment: environment)
        let gateway = try GatewayConfiguration(environment: environment)
        let worker = try WorkerConfiguration(environment: environment)
        #expect(service.logLevel == .debug && gateway.logLevel == .debug && worker.logLevel == .debug)
        #expect(service.busEncoding == .json && gateway.busEncoding == .json && worker.busEncoding == .json)
        #expect(service.client(of: "tcp://127.0.0.1:1").encoding == .json)
        let defaults = try ServiceConfiguration(service: .jobs, environment: Environment([:]))
        #expect(defaults.logLevel == .info && defaults.busEncoding == .binary)
    }

    @Test func aMalformedSharedSettingStopsEveryProcessNamingIt() {
        for (key, value) in [("LOG_LEVEL", "loud"), ("BUS_ENCODING", "xml")] {
            for make in Self.configurations([key: value]) {
                #expect {
                    try make()
                } throws: { error in
                    (error as? ConfigurationError).map { $0.key == key && $0.value == value } ?? false
                }
            }
        }
    }
}
