import Foundation
import Logging
import Messages
import Synchronization
import Testing

@testable import Bus

/// An echo that tells callers apart: the reply carries the caller's own tag.
struct Tagged: Codable, Sendable, Equatable {
    var tag: Int
    var text: String
}

enum TestMethods {
    static let echo = BusMethod<Tagged, Tagged>("test.echo", roles: Set(BusRole.known))
    static let wait = BusMethod<Int, Int>("test.wait", roles: Set(BusRole.known))
}

/// A gate slow handlers wait at until the test opens it.
final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>], arrived: Int)>((false, [], 0))

    func wait() async {
        await withCheckedContinuation { continuation in
            let open = state.withLock { state -> Bool in
                state.arrived += 1
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if open { continuation.resume() }
        }
    }

    var arrived: Int { state.withLock { $0.arrived } }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

func testRouter(gate: Gate = Gate()) -> BusRouter {
    var router = BusRouter()
    router.register(TestMethods.echo) { request, _ in request }
    router.register(TestMethods.wait) { value, _ in
        await gate.wait()
        return value
    }
    return router
}

func uniqueInproc() -> String { "inproc://test-\(UUID().uuidString)" }

/// A TCP port on loopback that nothing listens on right now.
/// A TCP port on loopback that nothing listens on right now, and that no other call in this test
/// run returns: from 10,000 to 20,000, below the kernel's ephemeral range (32768 and up), where an
/// outgoing connection of another test (an HTTP client, a worker) could take a port handed out by
/// the kernel before the server binds it; and apart from the system tests' 20,000 to 32,000.
func freePort() -> Int {
    while true {
        let candidate = BusPortPicker.next()
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(candidate).bigEndian)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        close(fd)
        if bound == 0 { return candidate }
    }
}

enum BusPortPicker {
    static let range = 10_000..<20_000
    private static let counter = Mutex(Int(getpid()) &* 7_919 % 10_000)

    static func next() -> Int {
        counter.withLock { value in
            value = (value + 1) % range.count
            return range.lowerBound + value
        }
    }
}

/// Runs a server on `endpoint` for the duration of `body`, then stops it and waits for it.
func withServer<T: Sendable>(
    endpoint: String,
    router: BusRouter = testRouter(),
    maxInFlight: Int = 1024,
    _ body: @Sendable (BusServer) async throws -> T
) async throws -> T {
    let server = BusServer(
        configuration: .init(endpoint: endpoint, maxInFlight: maxInFlight),
        router: router,
        logger: { var logger = Logger(label: "test.server"); logger.logLevel = .warning; return logger }()
    )
    let running = Task { try await server.run() }
    do {
        let result = try await body(server)
        server.requestStop()
        try await running.value
        return result
    } catch {
        server.requestStop()
        _ = try? await running.value
        throw error
    }
}

/// A client for the duration of `body`.
func withClient<T: Sendable>(
    endpoint: String,
    timeout: Duration = .seconds(5),
    _ body: @Sendable (BusClient) async throws -> T
) async throws -> T {
    try await withBusClient(.init(endpoint: endpoint, defaultTimeout: timeout), body)
}

/// The error a call fails with, or nil if it succeeded.
func failure<Request, Reply>(
    _ client: BusClient, _ method: BusMethod<Request, Reply>, _ request: Request, timeout: Duration? = nil
) async -> BusError? {
    do {
        _ = try await client.call(method, request, timeout: timeout)
        return nil
    } catch {
        return error
    }
}
