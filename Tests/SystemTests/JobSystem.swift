import AsyncHTTPClient
import Blobs
import Bus
import Foundation
import Logging
import GatewayApp
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import ImageOps
import Messages
import ServiceKit
import ServiceLifecycle
import Synchronization
import Testing
import ZeroMQ

/// The job pipeline as real processes (quota, jobs, workers) with the gateway's router in this
/// process, a blob store (a folder, or the test RADOS Gateway with `blobs: .s3`), and a small
/// inference provider for remote effects. A second gateway replica serves on `publicBase`, the
/// address in every signed URL: the workers reach the folder store's routes there, as they would
/// reach any gateway replica.
final class JobSystem: @unchecked Sendable {
    // @unchecked: driven by one test at a time, step by step.
    enum Store { case folder, s3 }
    static let secret = "system-test-jwt-secret-0123456789abcdef"
    static let adminToken = "system-test-admin"
    static let signingSecret = "system-test-url-signing-secret"
    static let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/images/photo.jpg")

    let services: RunningServices
    /// Where jobs takes workers (bound on every address when the system serves a second host).
    let workerPort = freePort()
    /// The address other hosts reach this one at (a veth of a test host), or loopback.
    let hostAddress: String
    var workerEndpoint: String { "tcp://\(hostAddress):\(workerPort)" }
    let providerPort = freePort()
    var workers: [ServiceProcess] = []
    let clients: ServiceClients
    /// Runs `clients` until `stop()`.
    let clientsRunning: Task<Void, Never>
    /// The in-process gateway's configuration; a test may change it before calling `gateway`.
    var configuration: GatewayConfiguration
    let provider: Task<Void, any Error>
    /// How many requests the provider is answering now, and the most at once so far.
    let providerLoad = ProviderLoad()
    var blobDirectory: String { services.dataDirectory.appendingPathComponent("blobs").path }
    /// The gateway replica the signed URLs point at (a real socket on a port chosen up front).
    let gatewayPort = freePort()
    var publicBase: String { "http://\(hostAddress):\(gatewayPort)" }
    /// The store's settings for the service processes (S3's, or none for the folder).
    let storeEnvironment: [String: String]
    var replica: ServiceProcess?
    let store: Store
    /// What both gateways (this process's and the replica) are started with besides the rest.
    let gatewayExtra: [String: String]
    /// With a second host the bus is on the network, so it runs with CURVE (services refuse plain
    /// text off loopback) and callers known by key: each process has its own key pair, and every
    /// service admits those keys with their roles. By role: what that process is started with.
    let curve: [BusRole: [String: String]]
    func curve(_ role: BusRole) -> [String: String] { curve[role] ?? [:] }

    init(workers count: Int = 1, uploadMaxBytes: Int = 20 << 20, workerCapacity: Int = 1, quota: [String: String] = [:], history: [String: String] = [:], jobs: [String: String] = [:],
         gateway gatewayExtra: [String: String] = [:], shareLifetime: Int = 7 * 86_400, dataDirectory: URL? = nil, blobs store: Store = .folder,
         hostAddress: String = "127.0.0.1", curve useCurve: Bool = false) async throws {
        self.hostAddress = hostAddress
        if hostAddress != "127.0.0.1" || useCurve {
            let server = try ZMQCurveKeyPair.generate()
            var own: [BusRole: ZMQCurveKeyPair] = [:]
            for role in [BusRole.gateway, .quota, .jobs, .history, .worker] { own[role] = try ZMQCurveKeyPair.generate() }
            let allowList = own.map { "\($0.key.rawValue):\($0.value.publicKey)" }.joined(separator: ",")
            var settings: [BusRole: [String: String]] = [:]
            for (role, pair) in own {
                settings[role] = ["BUS_CURVE_PUBLIC": server.publicKey, "BUS_CURVE_KEY": pair.secretKey]
                if role != .gateway && role != .worker {
                    settings[role]!["BUS_CURVE_SECRET"] = server.secretKey
                    settings[role]!["BUS_CURVE_CLIENTS"] = allowList
                }
            }
            curve = settings
        } else {
            curve = [:]
        }
        let port = providerPort
        self.store = store
        var environment = try store == .s3 ? TestS3.environment() : [:]
        if hostAddress != "127.0.0.1", var endpoint = URLComponents(string: environment["S3_ENDPOINT"] ?? "") {
            // The store as the other host reaches it, in the URLs jobs hands workers; jobs and the
            // gateway themselves (and the apps, here the test) reach it on loopback.
            endpoint.host = hostAddress
            environment["S3_WORKER_ENDPOINT"] = endpoint.string
        }
        storeEnvironment = environment
        let load = providerLoad
        provider = Task { try await Self.runProvider(port: port, load: load) }
        services = try RunningServices(only: [], dataDirectory: dataDirectory)
        let effects = """
            [{"id": "slow-remote", "title": "Slow AI", "processor": "remote", "endpoint": "http://127.0.0.1:\(port)/slow"},
             {"id": "broken-remote", "title": "Broken AI", "processor": "remote", "endpoint": "http://127.0.0.1:\(port)/bad"},
             {"id": "until-fixed-remote", "title": "Fixable AI", "processor": "remote", "endpoint": "http://127.0.0.1:\(port)/until-fixed"},
             {"id": "ten-second-remote", "title": "Very Slow AI", "processor": "remote", "endpoint": "http://127.0.0.1:\(port)/ten-seconds"},
             {"id": "held-remote", "title": "Held AI", "processor": "remote", "endpoint": "http://127.0.0.1:\(port)/held"},
             {"id": "noop", "title": "No-op", "processor": "noop"}]
            """
        try services.start(.quota, extra: [
            // A reservation is stale (released if jobs has no such job) after a minute: longer than
            // any creation takes between its reserve and its create on a loaded machine (with 1 s,
            // a creation behind a burst was abandoned under CI). A test of the stale scan sets less.
            "JOBS_ENDPOINT": services.endpoints[.jobs]!, "QUOTA_STALE_AFTER_S": "60", "QUOTA_STALE_SCAN_MS": "300",
        ].merging((curve[.quota] ?? [:])) { _, new in new }.merging(quota) { _, new in new })
        try services.start(.jobs, extra: [
            "JOBS_WORKER_BIND": "tcp://\(hostAddress == "127.0.0.1" ? hostAddress : "0.0.0.0"):\(workerPort)", "QUOTA_ENDPOINT": services.endpoints[.quota]!,
            "JOBS_EFFECTS": effects, "JOBS_RETRY_BASE_MS": "200",
            "URL_SIGNING_SECRET": Self.signingSecret, "PUBLIC_BASE_URL": "http://\(hostAddress):\(gatewayPort)",
        ].merging(storeEnvironment) { _, new in new }.merging((curve[.jobs] ?? [:])) { _, new in new }.merging(jobs) { _, new in new })
        try services.start(.history, extra: (curve[.history] ?? [:]).merging(history) { _, new in new })
        let configuration = try GatewayConfiguration(environment: Environment([
            "JWT_SECRET": Self.secret, "ADMIN_TOKEN": Self.adminToken, "BLOB_DIR": services.dataDirectory.appendingPathComponent("blobs").path,
            "URL_SIGNING_SECRET": Self.signingSecret, "PUBLIC_BASE_URL": "http://\(hostAddress):\(gatewayPort)",
            "UPLOAD_MAX_BYTES": "\(uploadMaxBytes)", "SHARE_TTL_S": "\(shareLifetime)",
            // The bus deadline of a production gateway (5 s) is a bound on an idle machine; with
            // the whole suite on 2 cores a call has waited longer, and a test of something else
            // got a 504. No test here is about that deadline (the bus tests are).
            "BUS_TIMEOUT_MS": "30000",
        ].merging(services.endpointVariables) { _, new in new }.merging(storeEnvironment) { _, new in new }.merging(curve[.gateway] ?? [:]) { _, new in new }
            .merging(gatewayExtra) { _, new in new }))
        self.gatewayExtra = gatewayExtra
        self.configuration = configuration
        clients = ServiceClients(configuration: configuration)
        let clients = clients
        clientsRunning = Task { await clients.run() }
        _ = try await waitUntilHealthy(clients.quota)
        _ = try await waitUntilHealthy(clients.jobs)
        _ = try await waitUntilHealthy(clients.history)
        try await startReplica()
        for _ in 0..<count { try startWorker(capacity: workerCapacity) }
    }

    /// Starts the gateway replica, a gateway process of its own, on `gatewayPort` with the
    /// system's blob store, and waits until it answers. (A process, not a router in this one: it
    /// serves every worker's input and outputs, work that would otherwise compete with the tests
    /// for this process's threads.)
    func startReplica() async throws {
        var environment = [
            "GATEWAY_HOST": hostAddress, "GATEWAY_PORT": "\(gatewayPort)", "JWT_SECRET": Self.secret, "ADMIN_TOKEN": Self.adminToken,
            "URL_SIGNING_SECRET": Self.signingSecret, "PUBLIC_BASE_URL": publicBase, "DATA_DIR": services.dataDirectory.path,
            "BLOB_DIR": blobDirectory, "UPLOAD_MAX_BYTES": "\(configuration.uploadMaxBytes)",
        ].merging(storeEnvironment) { _, new in new }
        for service in ServiceName.allCases { environment[service.endpointVariable] = services.endpoints[service]! }
        environment.merge((curve[.gateway] ?? [:])) { _, new in new }
        environment.merge(gatewayExtra) { _, new in new }
        replica = try ServiceProcess("gateway", environment: environment)
        // Asked without blocking a thread of the cooperative pool.
        let url = "\(publicBase)/healthz"
        try await waitUntil {
            let answer = try? await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(2))
            return answer?.status == .ok
        }
    }

    /// The path and query of a URL the gateway signed (its scheme and host dropped).
    static func path(_ url: String) -> String {
        guard let scheme = url.range(of: "://"), let slash = url[scheme.upperBound...].firstIndex(of: "/") else { return url }
        return String(url[slash...])
    }

    @discardableResult
    func startWorker(capacity: Int = 1, extra: [String: String] = [:], on host: TestHost? = nil) throws -> ServiceProcess {
        let worker = try ServiceProcess("worker", wrappedBy: host?.command(hiding: services.dataDirectory) ?? [], environment: [
            // No blob folder, no store settings: a worker has only its assignments' URLs.
            "JOBS_WORKER_ENDPOINT": workerEndpoint, "WORKER_ID": "w\(workers.count + 1)", "WORKER_CAPACITY": "\(capacity)",
        ].merging((curve[.worker] ?? [:])) { _, new in new }.merging(extra) { _, new in new })
        workers.append(worker)
        return worker
    }

    /// Every secret the system's processes were given (the bus's CURVE secret keys too, with
    /// `curve`), for tests that look for them where they must never be.
    var secrets: [String] {
        [Self.secret, Self.adminToken, Self.signingSecret]
            + curve.values.flatMap { [$0["BUS_CURVE_KEY"], $0["BUS_CURVE_SECRET"]].compactMap { $0 } }
    }

    /// What each process of the system (services, workers, the gateway replica) has written so far.
    var processLogs: [(process: String, log: String)] {
        services.processes.map { ($0.key.rawValue, $0.value.output) } + workers.map { ("worker", $0.output) }
            + (replica.map { [("gateway", $0.output)] } ?? [])
    }

    func stop() async {
        for worker in workers { await worker.stop() }
        await replica?.stop()
        clientsRunning.cancel()
        await clientsRunning.value
        await services.stopAll()
        provider.cancel()
    }

    /// Runs `body` against the gateway, built as its process builds it and served on a real
    /// socket (event streams need a connection that can close).
    func gateway(_ body: @Sendable (any TestClientProtocol) async throws -> Void) async throws {
        let app = try await buildApplication(configuration: configuration, logger: Logger(label: "gateway"))
        try await app.test(.live, body)
    }

    // MARK: Steps

    static func guest(_ device: UUID) -> HTTPFields { [.deviceId: device.uuidString] }

    static func json(_ response: TestResponse) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any]) ?? [:]
    }

    /// The job id a creation answered; an answer without one fails the test with what was
    /// answered instead (a status and body, not just "nil").
    static func jobId(of response: TestResponse, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        try #require(json(response)["jobId"] as? String,
                     "the creation answered \(response.status.code): \(String(buffer: response.body).prefix(500))", sourceLocation: sourceLocation)
    }

    /// Presigns and uploads `bytes`; returns the image key.
    static func upload(_ client: any TestClientProtocol, as user: HTTPFields, bytes: Data? = nil, contentType: String = "image/jpeg") async throws -> String {
        let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                               body: ByteBuffer(string: #"{"filename": "photo.jpg", "contentType": "\#(contentType)"}"#))
        #expect(presign.status == .ok)
        let answer = json(presign)
        let url = try #require(answer["uploadUrl"] as? String)
        let key = try #require(answer["imageKey"] as? String)
        let data = try bytes ?? Data(contentsOf: fixture)
        guard url.contains("/api/v1/uploads/") else {
            // The object store's own URL: the app's PUT goes there, with the headers it was given.
            let headers = answer["headers"] as? [String: String] ?? [:]
            var request = HTTPClientRequest(url: url)
            request.method = .PUT
            for (name, value) in headers { request.headers.add(name: name, value: value) }
            request.body = .bytes(ByteBuffer(bytes: data))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
            #expect(response.status == .ok, "upload to the store answered \(response.status)")
            return key
        }
        let put = try await client.execute(uri: path(url), method: .put,
                                           headers: [.contentType: contentType], body: ByteBuffer(bytes: data))
        #expect(put.status == .created, "upload answered \(put.status)")
        return key
    }

    static func createJob(_ client: any TestClientProtocol, as user: HTTPFields, imageKey: String, effect: String,
                          parameters: String = "{}", idempotencyKey: String? = nil, prompt: String? = nil) async throws -> TestResponse {
        var headers = user
        if let idempotencyKey { headers[.init("Idempotency-Key")!] = idempotencyKey }
        let promptField = prompt.map { #", "prompt": "\#($0)""# } ?? ""
        return try await client.execute(uri: "/api/v1/jobs", method: .post, headers: headers,
                                        body: ByteBuffer(string: #"{"imageKey": "\#(imageKey)", "effectId": "\#(effect)", "parameters": \#(parameters)\#(promptField)}"#))
    }

    /// Polls the status route until `done` holds (at most `limit`); returns the last answer.
    static func waitForStatus(_ client: any TestClientProtocol, as user: HTTPFields, jobId: String, within limit: Duration = .seconds(30),
                              until done: ([String: Any]) -> Bool = { ["completed", "failed", "cancelled"].contains($0["status"] as? String ?? "") }) async throws -> [String: Any] {
        let deadline = ContinuousClock.now.advanced(by: limit)
        while true {
            let response = try await client.execute(uri: "/api/v1/jobs/\(jobId)/status", method: .get, headers: user)
            let body = json(response)
            if done(body) || ContinuousClock.now > deadline { return body }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Width and height of an image file, through libvips.
    static func dimensions(of bytes: Data) throws -> (Int, Int) {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("probe-\(UUID().uuidString).jpg")
        try bytes.write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        _ = imageops_start("tests", 1)
        var width: Int32 = 0, height: Int32 = 0
        var error = [CChar](repeating: 0, count: 256)
        guard imageops_probe(file.path, &width, &height, &error, error.count) == 0 else { return (0, 0) }
        return (Int(width), Int(height))
    }

    // MARK: The inference provider

    /// `POST /slow` answers the fixture image after 3 s, `POST /ten-seconds` after 10 s, and
    /// `POST /held` once `providerLoad.release()` is called (or after 2 minutes); `POST /bad`
    /// answers 400, and `POST /until-fixed` too until `providerLoad.fixed`.
    static func runProvider(port: Int, load: ProviderLoad) async throws {
        // Read once, before serving: every answer is the same image, and no handler reads a file.
        let fixtureBytes = try Data(contentsOf: fixture)
        let image: @Sendable () -> Response = { Response(status: .ok, headers: [.contentType: "image/jpeg"], body: .init(byteBuffer: ByteBuffer(bytes: fixtureBytes))) }
        let router = Router()
        for (path, delay) in [("/slow", 3), ("/ten-seconds", 10)] {
            router.post(RouterPath(path)) { _, _ -> Response in
                load.begin()
                defer { load.end() }
                try await Task.sleep(for: .seconds(delay))
                return image()
            }
        }
        router.post("/held") { _, _ -> Response in
            load.begin()
            defer { load.end() }
            // A condition waited for, not a time: a test holds a job at the provider for as long
            // as it looks at what happens meanwhile, however busy the machine.
            let limit = ContinuousClock.now.advanced(by: .seconds(120))
            while !load.released, ContinuousClock.now < limit { try await Task.sleep(for: .milliseconds(20)) }
            return image()
        }
        router.post("/until-fixed") { _, _ -> Response in
            guard load.fixed else {
                return Response(status: .badRequest, headers: [.contentType: "text/plain"], body: .init(byteBuffer: ByteBuffer(string: "broken until fixed")))
            }
            return image()
        }
        router.post("/bad") { _, _ -> Response in
            Response(status: .badRequest, headers: [.contentType: "text/plain"], body: .init(byteBuffer: ByteBuffer(string: "no")))
        }
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: port)))
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: app.logger))
        try await withTaskCancellationHandler {
            try await group.run()
        } onCancel: {
            Task { await group.triggerGracefulShutdown() }
        }
    }
}

/// The inference provider's load: requests being answered now, and the most at once.
final class ProviderLoad: Sendable {
    private let state = Mutex<(now: Int, most: Int, total: Int)>((0, 0, 0))
    func begin() { state.withLock { $0.now += 1; $0.most = max($0.most, $0.now); $0.total += 1 } }
    func end() { state.withLock { $0.now -= 1 } }
    var most: Int { state.withLock { $0.most } }
    /// Calls answered or being answered, all told.
    var total: Int { state.withLock { $0.total } }
    /// Calls being answered now.
    var now: Int { state.withLock { $0.now } }
    /// Whether `/held` answers now (it holds each call until then).
    private let letGo = Mutex(false)
    var released: Bool { letGo.withLock { $0 } }
    func release() { letGo.withLock { $0 = true } }
    /// Whether `/until-fixed` has been fixed (it answers 400 until then).
    private let repaired = Mutex(false)
    var fixed: Bool {
        get { repaired.withLock { $0 } }
        set { repaired.withLock { $0 = newValue } }
    }
}
