import AsyncHTTPClient
@testable import Blobs
import Bus
import Foundation
import HistoryService
import JobsService
import QuotaService
import GatewayApp
import Messages
import ServiceKit
import Testing
import WorkerKit
import ZeroMQ

/// The settings every process shares are read by one parser each (`Environment.logLevel`,
/// `Environment.busEncoding`): every process takes the same values, and a malformed one stops
/// each of them naming the variable.
@Suite("Shared settings", .timeLimit(.minutes(5)))
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
        #expect(defaults.logLevel == .info && defaults.busEncoding == .binary && defaults.logFormat == .text)
        let json = Environment(["LOG_FORMAT": "JSON"])
        #expect(try ServiceConfiguration(service: .quota, environment: json).logFormat == .json)
        #expect(try GatewayConfiguration(environment: json).logFormat == .json && WorkerConfiguration(environment: json).logFormat == .json)
    }

    /// Traces are exported only when the standard OpenTelemetry variables ask for them.
    @Test func tracesAreOnOnlyWhenTheOpenTelemetryVariablesAskForThem() {
        #expect(!ProcessTracing.isRequested([:]))
        #expect(!ProcessTracing.isRequested(["OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": ""]))
        #expect(ProcessTracing.isRequested(["OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"]))
        #expect(ProcessTracing.isRequested(["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"]))
        #expect(ProcessTracing.isRequested(["OTEL_TRACES_EXPORTER": "otlp"]))
        #expect(!ProcessTracing.isRequested(["OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"]))
        #expect(!ProcessTracing.isRequested(["OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"]))
    }

    /// History's pool to PostgreSQL: as many connections as asked, else twice the cores within
    /// 4 to 20; none or a word stops it, naming the variable.
    @Test func historysPoolToPostgreSQLHasTheConnectionsAskedOrTwiceTheCores() throws {
        #expect(try HistoryConfiguration(environment: Environment(["HISTORY_DATABASE_CONNECTIONS": "3"]), dataDirectory: "/tmp").databaseConnections == 3)
        let cores = ProcessInfo.processInfo.activeProcessorCount
        #expect(try HistoryConfiguration(environment: Environment([:]), dataDirectory: "/tmp").databaseConnections == min(20, max(4, 2 * cores)))
        for value in ["0", "-2", "many"] {
            #expect {
                _ = try HistoryConfiguration(environment: Environment(["HISTORY_DATABASE_CONNECTIONS": value]), dataDirectory: "/tmp")
            } throws: { error in
                (error as? ConfigurationError)?.key == "HISTORY_DATABASE_CONNECTIONS"
            }
        }
    }

    @Test func aMalformedSharedSettingStopsEveryProcessNamingIt() {
        for (key, value) in [("LOG_LEVEL", "loud"), ("BUS_ENCODING", "xml"), ("LOG_FORMAT", "yaml")] {
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

/// Each process's list of its variables (the README's tables and `compose.yaml` are checked
/// against these lists) is exactly what its configuration reads: a variable read and not
/// listed, or listed and never read, fails here.
@Suite("Configuration variables", .timeLimit(.minutes(5)))
struct ConfigurationVariablesTests {
    /// Values that make the optional parts read their variables too.
    static let variants: [[String: String]] = [
        [:], ["APP_ATTEST_APP_ID": "ABCDE12345.com.example.photoedit"],
        ["BUS_CURVE_PUBLIC": try! ZMQCurveKeyPair.generate().publicKey],
        // The S3 store's settings are read only with it
        ["BLOB_STORE": "s3", "S3_BUCKET": "photos", "AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "secret"],
    ]

    /// What a bus service's main reads: its shared settings, and whether its endpoint may be
    /// plain where other machines reach it.
    static func service(_ service: ServiceName, _ environment: Environment) throws {
        _ = try ServiceConfiguration(service: service, environment: environment)
        try BusSecurity.checkExposure("tcp://0.0.0.0:1", variable: service.bindVariable, curve: false, knownCallers: false, environment: environment)
    }

    static func check(_ name: String, listed: [String], read: (Environment) throws -> Void) {
        var seen = Set<String>()
        for values in variants { seen.formUnion(Environment.keysRead(with: values, by: read)) }
        let listed = Set(listed)
        #expect(seen.subtracting(listed).isEmpty, "\(name) reads \(seen.subtracting(listed).sorted()) without listing them")
        let unread = listed.subtracting(seen)
        #expect(unread.isEmpty, "\(name) lists \(unread.sorted()) but never reads them")
    }

    @Test func everyProcessListsExactlyTheVariablesItReads() {
        Self.check("gateway", listed: GatewayConfiguration.environmentKeys) {
            _ = try GatewayConfiguration(environment: $0)
        }
        Self.check("worker", listed: WorkerConfiguration.environmentKeys) {
            _ = try ProviderSettings(environment: $0)
            _ = try WorkerConfiguration(environment: $0)
        }
        Self.check("quota", listed: QuotaConfiguration.environmentKeys + ServiceConfiguration.environmentKeys(for: .quota)) {
            try? Self.service(.quota, $0)
            _ = try QuotaConfiguration(environment: $0, dataDirectory: "/tmp")
        }
        Self.check("history", listed: HistoryConfiguration.environmentKeys + ServiceConfiguration.environmentKeys(for: .history)) {
            try? Self.service(.history, $0)
            _ = try HistoryConfiguration(environment: $0, dataDirectory: "/tmp")
        }
        Self.check("jobs", listed: JobsConfiguration.environmentKeys + ServiceConfiguration.environmentKeys(for: .jobs)) {
            try? Self.service(.jobs, $0)
            _ = try JobsConfiguration(environment: $0, dataDirectory: "/tmp")
        }
    }
}

/// The addresses signed URLs name: each as its readers reach it (apps through the gateway, workers
/// through jobs), each defaulting to the one address there is.
@Suite("Addresses per audience", .timeLimit(.minutes(5)))
struct AudienceAddressTests {
    static let s3 = ["BLOB_STORE": "s3", "S3_BUCKET": "photos", "AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "secret",
                     "S3_ENDPOINT": "http://127.0.0.1:7480"]

    @Test func theGatewayNamesWhereItListensOrLoopbackForEveryInterface() throws {
        let specific = try GatewayConfiguration(environment: Environment(["GATEWAY_HOST": "10.0.0.5", "GATEWAY_PORT": "9000"]))
        #expect(specific.publicBaseURL == "http://10.0.0.5:9000" && !specific.publicBaseURLGuessed)
        let everywhere = try GatewayConfiguration(environment: Environment(["GATEWAY_HOST": "0.0.0.0", "GATEWAY_PORT": "9000"]))
        #expect(everywhere.publicBaseURL == "http://127.0.0.1:9000" && everywhere.publicBaseURLGuessed)
        let told = try GatewayConfiguration(environment: Environment(["GATEWAY_HOST": "0.0.0.0", "PUBLIC_BASE_URL": "https://api.example.com"]))
        #expect(told.publicBaseURL == "https://api.example.com" && !told.publicBaseURLGuessed)
    }

    @Test func jobsSignsForWorkersAndTheGatewayForAppsEachAtItsOwnAddress() async throws {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        // The folder store: workers' URLs at WORKER_BASE_URL, webhooks still at PUBLIC_BASE_URL
        let folder = ["PUBLIC_BASE_URL": "https://api.example.com", "WORKER_BASE_URL": "http://gateway.internal:8080", "BLOB_DIR": "/tmp/unused"]
        let jobs = try BlobStoreConfiguration(environment: folder, audience: .workers)
        #expect(jobs.presignBaseURL == "http://gateway.internal:8080" && jobs.publicBaseURL == "https://api.example.com")
        #expect(try BlobStoreConfiguration(environment: folder, audience: .apps).presignBaseURL == "https://api.example.com")
        // The object store: each audience's endpoint named and signed for, the store's own used otherwise
        let split = Self.s3.merging(["S3_WORKER_ENDPOINT": "http://10.9.0.1:7480", "S3_PUBLIC_ENDPOINT": "https://files.example.com"]) { _, new in new }
        for (audience, expected) in [(BlobStoreConfiguration.Audience.workers, "http://10.9.0.1:7480/photos/a/b.jpg?"),
                                     (.apps, "https://files.example.com/photos/a/b.jpg?")] {
            guard case .s3(let configuration) = try BlobStoreConfiguration(environment: split, audience: audience).store else {
                Issue.record("not the S3 store")
                continue
            }
            let store = S3BlobStore(configuration: configuration, client: .shared)
            let get = store.presignedGET("a/b.jpg", expiresIn: 60, now: now)
            #expect(get.hasPrefix(expected), "\(get)")
            #expect(store.presignedPUT("a/b.jpg", contentType: "image/jpeg", owner: "u", expiresIn: 60, now: now).url.hasPrefix(expected))
            #expect(store.address(of: "a/b.jpg").url == "http://127.0.0.1:7480/photos/a/b.jpg")
        }
        guard case .s3(let plain) = try BlobStoreConfiguration(environment: Self.s3, audience: .workers).store else { return }
        #expect(S3BlobStore(configuration: plain, client: .shared).presignedGET("k.jpg", expiresIn: 60, now: now).hasPrefix("http://127.0.0.1:7480/photos/k.jpg?"))
        // A malformed one is refused, naming it
        #expect(throws: BlobStoreError.self) { try BlobStoreConfiguration(environment: Self.s3.merging(["S3_WORKER_ENDPOINT": "not a url"]) { _, new in new }, audience: .workers) }
    }
}
