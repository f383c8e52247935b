import Bus
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Logging
import Messages
import PostgresNIO
@testable import Storage
import Synchronization
import Testing
import TestSupport

/// A call made for a request with a minute left on `pool`: what it threw, and how long it took.
func callForARequest(_ pool: PostgresPool, logger: Logger) async -> (thrown: (any Error)?, took: Duration) {
    var thrown: (any Error)?
    let took = await ContinuousClock().measure {
        do {
            try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(60))) {
                _ = try await pool.connection { db in try await db.query("SELECT 1", logger: logger) }
            }
        } catch {
            thrown = error
        }
    }
    return (thrown, took)
}

@Suite("PostgreSQL pool", .timeLimit(.minutes(5)))
struct PostgresPoolTests {
    let logger = { var logger = Logger(label: "test.pool"); logger.logLevel = .critical; return logger }()

    @Test func aServerThatCannotBeReachedFailsCallsFastAsUnavailableUntilItsPortAnswers() async throws {
        // Given a pool of the test server's database at a port where nothing listens yet
        var location = try await TestPostgres.freshDatabase()
        let server = location.port
        location.port = freePort()
        let clock = ContinuousClock()
        let logger = logger
        try await PostgresPool(location: location, logger: logger).running { pool in
            // When a call is made, it fails once its wait for a connection has had the server
            // probed, as unavailable
            var thrown: (any Error)?
            let first = await clock.measure {
                do { _ = try await pool.connection { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
            }
            let error = try #require(thrown)
            #expect(error is PostgresUnavailable, "\(error)")
            #expect(first >= PostgresPool.acquireLimit)
            #expect(StorageFailure.busError(for: error)?.code == .unavailable)
            #expect(!"\(error)".contains(location.password ?? "-"))
            // And the calls right after fail at once, without waiting again
            thrown = nil
            let second = await clock.measure {
                do { _ = try await pool.transaction { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
            }
            #expect(thrown is PostgresUnavailable)
            #expect(second < PostgresPool.acquireLimit)
            // And once the server answers on the port, the pool's own probe finds it, and calls
            // are served again
            let proxy = try #require(FreezableProxy(port: location.port, upstream: server))
            defer { proxy.stop() }
            try await waitUntil(within: .seconds(60)) {
                (try? await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) }) == 1
            }
        }
    }

    @Test func aServerWhoseConnectionsNeverGoThroughIsTakenForDownAfterTheUnreachableLimit() async throws {
        // Given a pool of the test database at a port whose connections never go through: a
        // listener whose accept queue is full drops every SYN, as a partition between this host
        // and the database's does (neither refused nor answered)
        var location = try await TestPostgres.freshDatabase()
        let blackhole = try #require(UnreachablePort())
        defer { blackhole.close() }
        location.port = blackhole.port
        let logger = logger
        try await PostgresPool(location: location, logger: logger).running { pool in
            // When a call for a request with a minute left is made
            let (thrown, took) = await callForARequest(pool, logger: logger)
            // Then, once its probes have found no way through for the unreachable limit, it is
            // answered unavailable (nothing was done: another replica may serve it), long before
            // its deadline; a single probe without an answer is no finding, so not before
            #expect(thrown is PostgresUnavailable, "\(String(describing: thrown))")
            #expect(took >= PostgresPool.acquireLimit + PostgresOutage.unreachableLimit, "answered after \(took)")
            #expect(took < .seconds(40), "answered after \(took), its deadline 60 s")
        }
    }

    @Test func aFrozenServerFailsCallsBeforeTheirDeadlineAndIsFoundBackWhenItRunsAgain() async throws {
        // Given a pool of the test server through a proxy, serving
        var location = try await TestPostgres.freshDatabase()
        let proxy = try #require(FreezableProxy(upstream: location.port))
        defer { proxy.stop() }
        location.port = proxy.port
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 2, logger: logger).running { pool in
            #expect(try await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) } == 1)
            // When the server freezes (takes connections, answers nothing: SIGSTOP, a hung host)
            proxy.freeze()
            // Then a call made for a request with a minute left is answered long before that
            // deadline, though its statement went to a connection of the frozen server: it may
            // have committed, so timed out (storage_unavailable)
            let (timedOut, took) = await callForARequest(pool, logger: logger)
            var thrown = timedOut
            #expect(thrown is PostgresOperationTimedOut, "\(String(describing: thrown))")
            #expect(took < .seconds(40), "answered after \(took), its deadline 60 s")
            // And the calls after it fail at once as unavailable (nothing was done)
            thrown = nil
            do { _ = try await pool.transaction { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
            #expect(thrown is PostgresUnavailable, "\(String(describing: thrown))")
            // And once it runs again, the pool's own probe finds it, and calls are served
            proxy.thaw()
            try await waitUntil(within: .seconds(60)) {
                (try? await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) }) == 1
            }
        }
    }

    @Test func aCallRightAfterTheServerIsBackIsServedWithinItsDeadline() async throws {
        // Given a pool of the test server through a proxy, serving
        var location = try await TestPostgres.freshDatabase()
        let server = location.port
        var proxy = try #require(FreezableProxy(upstream: server))
        location.port = proxy.port
        let logger = logger
        let clock = ContinuousClock()
        try await PostgresPool(location: location, logger: logger).running { pool in
            #expect(try await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) } == 1)
            // When the server goes away (its connections closed, new ones refused) for 5 s, as a
            // restart takes, with calls failing meanwhile
            proxy.stop()
            let away = clock.now.advanced(by: .seconds(5))
            while clock.now < away {
                _ = try? await pool.connection(limit: .milliseconds(1500)) { db in try await db.query("SELECT 1", logger: logger) }
                try await Task.sleep(for: .milliseconds(100))
            }
            // And comes back on the same port
            proxy = try #require(FreezableProxy(port: location.port, upstream: server))
            defer { proxy.stop() }
            // Then the first call that the pool does not refuse at once (it has found the server
            // back) is served within its request's deadline, not after it
            let deadline = clock.now.advanced(by: .seconds(60))
            var served = false
            while !served, clock.now < deadline {
                var thrown: (any Error)?
                let took = await clock.measure {
                    do {
                        try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(5))) {
                            _ = try await pool.transaction { db in try await db.query("SELECT 1", logger: logger) }
                        }
                    } catch {
                        thrown = error
                    }
                }
                if thrown == nil {
                    served = true
                } else if thrown is PostgresUnavailable, took < PostgresPool.acquireLimit {
                    try await Task.sleep(for: .milliseconds(100))
                } else {
                    Issue.record("a call after the server came back failed after \(took): \(String(describing: thrown))")
                    return
                }
            }
            #expect(served)
        }
    }

    @Test func aTransactionPastItsRequestsDeadlineIsStoppedAndTheNextOneRuns() async throws {
        // Given a pool of a real server, and one connection only
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
            // (its connection made first, so that the request's time goes to the statement alone)
            _ = try await pool.connection { db in try await db.query("SELECT 1", logger: logger) }
            // When a transaction made for a bus request outlasts the request's deadline
            var thrown: (any Error)?
            do {
                try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(3))) {
                    _ = try await pool.transaction { db in try await db.query("SELECT pg_sleep(30)", logger: logger) }
                }
            } catch {
                thrown = error
            }
            // Then its caller hears it failed in time to answer the request (PostgreSQL stops the
            // statement, or the pool answers first: either way storage_unavailable, outcome unknown)
            let error = try #require(thrown)
            #expect(error is PostgresOperationTimedOut || error is PSQLError, "\(error)")
            #expect(StorageFailure.busError(for: error)?.code == .storageUnavailable)
            // And the statement was stopped, so the only connection of the pool serves the next
            // call (well before the 30 s the statement would have taken)
            let answer = try await pool.connection(limit: .seconds(15)) { db in try await db.first("SELECT 42", as: Int.self, logger: logger) }
            #expect(answer == 42)
        }
    }

    /// Runs `body` while an operation holds the pool's one connection, then lets it go.
    static func holdingTheOnlyConnection(of pool: PostgresPool, _ body: @Sendable () async throws -> Void) async throws {
        let (holding, holdingStarted) = AsyncStream<Void>.makeStream()
        let (release, releaseNow) = AsyncStream<Void>.makeStream()
        async let holder: Void = {
            _ = try? await pool.connection(limit: .seconds(60)) { _ in
                holdingStarted.yield()
                for await _ in release { break }
            }
        }()
        for await _ in holding { break }
        do {
            try await body()
        } catch {
            releaseNow.yield()
            await holder
            throw error
        }
        releaseNow.yield()
        await holder
    }

    @Test func anOperationForNoRequestGivesUpAfterTheBackgroundLimit() async throws {
        // Given a pool of one connection, held by an operation until the test lets it go, and a
        // bound of 1.5 s on operations done for no request
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 1, backgroundLimit: .milliseconds(1500), logger: logger).running { pool in
            try await Self.holdingTheOnlyConnection(of: pool) {
                // When an operation outside any request (no limit, no deadline) waits for it, with
                // the server up (so no probe ends the wait)
                let outcome = Mutex<Result<Int, any Error>?>(nil)
                let waiter = Task {
                    let result: Result<Int, any Error>
                    do { result = .success(try await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) ?? 0 }) } catch { result = .failure(error) }
                    outcome.withLock { $0 = result }
                }
                // Then it is told unavailable once the bound has passed, not left waiting for as
                // long as the connection is held
                try await waitUntil(within: .seconds(60)) { outcome.withLock { $0 != nil } }
                await waiter.value
                if case .failure(let error) = outcome.withLock({ $0 }) {
                    #expect(error is PostgresUnavailable, "\(error)")
                } else {
                    Issue.record("expected PostgresUnavailable, got \(String(describing: outcome.withLock { $0 }))")
                }
            }
        }
    }

    @Test func aBodyStartsOnlyIfItsCallerStillWaits() async throws {
        // Given a pool of one connection, held by an operation until the test lets it go
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
            try await pool.connection { db in _ = try await db.query("CREATE TABLE ran (n int)", logger: logger) }
            try await Self.holdingTheOnlyConnection(of: pool) {
                // When another caller gives up waiting for the connection
                var thrown: (any Error)?
                do {
                    _ = try await pool.connection(limit: .milliseconds(500)) { db in try await db.query("INSERT INTO ran VALUES (1)", logger: logger) }
                } catch {
                    thrown = error
                }
                #expect(thrown is PostgresUnavailable, "\(String(describing: thrown))")
            }
            // Then its body never runs, even once the connection is free: the wait stayed queued,
            // and the pool's queue is first come, first served, so the count below runs after it
            var rows: Int?
            try await waitUntil(within: .seconds(60)) {
                rows = try? await pool.connection { db in try await db.first("SELECT count(*) FROM ran", as: Int.self, logger: logger) }
                return rows != nil
            }
            #expect(rows == 0)
        }
    }

    /// Ends the connection `db` from the server's side (its backend terminated) and waits until
    /// the client has seen it closed.
    func closeFromTheServer(_ db: PostgresConnection) async throws {
        do { try await db.query("SELECT pg_terminate_backend(pg_backend_pid())", logger: logger) } catch {}
        try await waitUntil(within: .seconds(60)) { db.isClosed }
        // And its pipeline taken down (NIO does that a turn of the loop after the close): a
        // statement written from now on reaches no handler.
        try await db.closeFuture.get()
    }

    struct BodyFailed: Error {}

    @Test func aTransactionWhoseConnectionTheServerClosedEndsWithoutWritingToIt() async throws {
        // Given a pool of a real server
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, logger: logger).running { pool in
            // When a transaction's connection is closed by the server and its body then fails
            // (ROLLBACK), or returns (COMMIT)
            var thrown: [any Error] = []
            for fails in [true, false] {
                do {
                    try await BusDeadline.$current.withValue(.now.advanced(by: .seconds(30))) {
                        try await pool.transaction { db in
                            try await closeFromTheServer(db)
                            if fails { throw BodyFailed() }
                        }
                    }
                } catch {
                    thrown.append(error)
                }
            }
            // Then each ends at once with what happened: the body's error, and nothing committed
            // (a statement written to a closed connection is never answered: each would instead
            // have waited out its deadline, answered as timed out)
            #expect(thrown.count == 2)
            #expect(thrown.first is BodyFailed, "\(thrown)")
            #expect(thrown.last is PostgresUnavailable, "\(thrown)")
            // And the pool serves the next call on a new connection
            try await waitUntil {
                (try? await pool.connection { db in try await db.first("SELECT 1", as: Int.self, logger: logger) }) == 1
            }
        }
    }

    @Test func aStopDoesNotWaitForAnOperationThatCanNeverEnd() async throws {
        // Given a pool of a real server, and an operation stuck for good: a statement written to
        // a connection the server closed (postgres-nio never answers it)
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, logger: logger).running { pool in
            await #expect(throws: PostgresOperationTimedOut.self) {
                try await pool.connection(limit: .seconds(5)) { db in
                    try await closeFromTheServer(db)
                    try await db.query("SELECT 1", logger: logger)
                }
            }
        }
        // When the pool stops, then the stop ends (after its grace) instead of waiting for ever
    }

    @Test func batchesRunOnThePoolWhileItRunsAndAreAnsweredUnavailableOnceItHasStopped() async throws {
        // Given a batcher whose batches run in the pool (each one statement of its own)
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        let pool = PostgresPool(location: location, logger: logger)
        let batcher = PostgresBatcher<Int, Int>(database: pool) { numbers in
            try await pool.connection { db in
                let total = try await db.first("SELECT \(numbers.reduce(0, +))::bigint", as: Int.self, logger: logger) ?? 0
                return numbers.map { _ in .success(total) }
            }
        }
        // When 20 operations are submitted while the pool runs, each is answered by its batch
        try await pool.running { _ in
            let answers = try await withThrowingTaskGroup(of: Int.self) { group in
                for number in 1...20 { group.addTask { try await batcher.submit(number) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == 20 && answers.allSatisfy { $0 > 0 })
            #expect(batcher.statistics.operations == 20 && batcher.waiting == 0, "\(batcher.statistics)")
        }
        // And once it has stopped, one submitted is told at once that the database is unavailable
        // (its batch has no pool to run in), and nothing waits
        await #expect(throws: PostgresUnavailable.self) { _ = try await batcher.submit(1) }
        #expect(batcher.waiting == 0 && batcher.statistics.operations == 20)
    }

    @Test func aBatchThatStallsAnswersEachOperationByItsOwnDeadline() async throws {
        // Given a batcher whose first batch stalls until the test lets it go (a lock held
        // elsewhere, a server cut off), though it is given at least a second
        let location = try await TestPostgres.freshDatabase()
        let pool = PostgresPool(location: location, logger: logger)
        let (held, hold) = AsyncStream<Void>.makeStream()
        let (release, letGo) = AsyncStream<Void>.makeStream()
        let batches = Atomic<Int>(0)
        let batcher = PostgresBatcher<String, String>(database: pool) { names in
            if batches.add(1, ordering: .sequentiallyConsistent).oldValue == 0 {
                hold.yield()
                for await _ in release { break }
            }
            return names.map { .success($0) }
        }
        let answers = Mutex<[String: Result<String, any Error>]>([:])
        try await pool.running { _ in
            await withTaskGroup(of: Void.self) { group in
                let submit: @Sendable (String, Duration) async -> Void = { name, within in
                    let answer: Result<String, any Error>
                    do {
                        answer = .success(try await BusDeadline.$current.withValue(.now.advanced(by: within)) { try await batcher.submit(name) })
                    } catch {
                        answer = .failure(error)
                    }
                    answers.withLock { $0[name] = answer }
                }
                // When an operation with 3 s left makes that batch, and once it stalls, another
                // with 3 s and one with a minute wait for the next (3 s: time enough for the batch
                // to start on a busy machine, or the first would be turned away before it ran)
                group.addTask { await submit("in the batch", .seconds(3)) }
                for await _ in held { break }
                group.addTask { await submit("waiting", .seconds(3)) }
                group.addTask { await submit("minute", .seconds(60)) }
                // Then, the batch still stalled, the two with 3 s are answered: the one in it
                // timed out (the batch may yet commit it), the one waiting unavailable (nothing
                // was done)
                let end = ContinuousClock.now.advanced(by: .seconds(30))
                while answers.withLock({ $0.count }) < 2, ContinuousClock.now < end { try? await Task.sleep(for: .milliseconds(10)) }
                answers.withLock { answers in
                    #expect(answers.count == 2 && answers["minute"] == nil, "\(answers)")
                    #expect(throws: PostgresOperationTimedOut.self) { try answers["in the batch"]?.get() }
                    #expect(throws: PostgresUnavailable.self) { try answers["waiting"]?.get() }
                }
                // And once it is let go, the one with a minute is answered by the next batch
                letGo.yield()
            }
        }
        #expect(try answers.withLock { try $0["minute"]?.get() } == "minute")
        #expect(batches.load(ordering: .sequentiallyConsistent) == 2)
    }

    @Test func aRunThatIsCancelledStillWaitsForTheOperationsRunning() async throws {
        // Given a pool run for the span of a body (its run is cancelled when the body ends), and an
        // operation that goes on for a while after its connection is taken from it
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        final class Flag: Sendable { let value = Atomic<Bool>(false) }
        let ended = Flag()
        let (started, start) = AsyncStream<Void>.makeStream()
        let operation = try await PostgresPool(location: location, logger: logger).running { pool in
            let operation = Task {
                try? await pool.connection(limit: .seconds(30)) { _ in
                    start.yield()
                    try? await Task.sleep(for: .milliseconds(500))
                    ended.value.store(true, ordering: .sequentiallyConsistent)
                }
            }
            for await _ in started { break }
            return operation
        }
        // When the body has ended and the run with it, then the operation had ended first
        // (an iterator in a cancelled task ends at once: the run once took that for "all stopped")
        let endedFirst = ended.value.load(ordering: .sequentiallyConsistent)
        #expect(endedFirst)
        await operation.value
    }
}

/// A port on loopback whose connections never go through: a listener with an accept queue of one,
/// filled and never accepted, so the kernel drops every further SYN (what a partition does to a
/// connection: no refusal, no answer).
final class UnreachablePort: Sendable {
    let port: Int
    private let descriptors: [Int32]

    init?() {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ready = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, length) == 0 && listen(listener, 0) == 0 && getsockname(listener, $0, &length) == 0
            }
        }
        guard ready else { Glibc.close(listener); return nil }
        port = Int(UInt16(bigEndian: address.sin_port))
        // Two connections fill a queue of one (the kernel takes one more than the backlog).
        var fillers: [Int32] = []
        for _ in 0..<2 {
            let filler = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            _ = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(filler, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            fillers.append(filler)
        }
        descriptors = [listener] + fillers
    }

    func close() { for descriptor in descriptors { Glibc.close(descriptor) } }
}

/// A PostgreSQL at its connection limit, on a server of the test's own: its `initdb` and start are
/// seconds of CPU and disk, so it runs with the heavy suites, alone (the Makefile's HEAVY_TESTS),
/// not beside the store suites.
@Suite("PostgreSQL at its connection limit", .timeLimit(.minutes(5)))
struct PostgresConnectionLimitTests {
    let logger = { var logger = Logger(label: "test.pool"); logger.logLevel = .critical; return logger }()

    @Test func aServerAtItsConnectionLimitIsFullNotDownAndACallWaitsForItsConnection() async throws {
        _ = try TestPostgres.location()  // where the tests' PostgreSQL is installed
        // Given a PostgreSQL of this test's own, every one of its 5 connections taken
        let server = try await OwnPostgres.start(maxConnections: 5)
        do {
            try await callWaitsAtTheConnectionLimit(server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    func callWaitsAtTheConnectionLimit(_ server: OwnPostgres) async throws {
        var fillers = try ConnectionFillers(port: server.location.port)
        defer { fillers.close() }
        // When it is probed, it is found full (it answered 53300 before authentication), not down
        let probe = PostgresOutage(host: server.location.host, port: server.location.port, username: server.location.username,
                                   database: server.location.database, logger: logger)
        #expect(await probe.probe() == .full)
        try await PostgresPool(location: server.location, logger: logger).running { pool in
            // And a call for a request waits past the point where its pool has the server probed
            let call = Task { await callForARequest(pool, logger: logger) }
            try await waitUntil(within: .seconds(60)) { pool.outage.probesMade.load(ordering: .acquiring) > 0 }
            #expect(!pool.outage.isDown)
            // Then once connections are free again, it is served (it did not fail as unavailable)
            fillers.close()
            let (thrown, _) = await call.value
            #expect(thrown == nil, "\(String(describing: thrown))")
        }
        #expect(await probe.probe() == .accepting)
    }
}

/// A PostgreSQL of one test's own (`scripts/postgres-server.sh`, as the tests' server is started),
/// for what cannot be done to the shared one, such as taking all its connections.
struct OwnPostgres {
    let directory: String
    let location: PostgresLocation

    static func start(maxConnections: Int) async throws -> OwnPostgres {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pg-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try await script(["start", directory, "\(freePort())"], environment: ["POSTGRES_THROWAWAY": "1", "POSTGRES_MAX_CONNECTIONS": "\(maxConnections)"])
        let text = try String(contentsOfFile: directory + "/postgres.env", encoding: .utf8)
        let line = try #require(text.split(separator: "\n").first { $0.hasPrefix("POSTGRES_URL=") })
        return OwnPostgres(directory: directory, location: try PostgresLocation(url: String(line.dropFirst("POSTGRES_URL=".count))))
    }

    func stop() async {
        try? await Self.script(["stop", directory])
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Runs `scripts/postgres-server.sh` with `arguments` (as `ServiceProcess.runToEnd` runs a
    /// tool: never blocking a thread of the pool); throws if it fails.
    static func script(_ arguments: [String], environment: [String: String] = [:]) async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let (status, output) = try await ServiceProcess.runToEnd(
            "/bin/bash", [root.appendingPathComponent("scripts/postgres-server.sh").path] + arguments,
            environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, within: .seconds(120))
        // The output names the server's URL with its password: only its last line is told.
        guard status == 0 else { throw ToolFailed(description: "postgres-server.sh \(arguments[0]) failed: \(output.split(separator: "\n").last ?? "")") }
    }
}

/// Connections that take every slot of a PostgreSQL: each sends the startup message and holds
/// the slot while the server waits for its password (up to `authentication_timeout`, a minute),
/// until one is answered "sorry, too many clients already".
struct ConnectionFillers {
    private var descriptors: [Int32] = []

    init(port: Int) throws {
        let startup = PostgresOutage.startupMessage(username: "photoedit", database: "photoedit")
        for _ in 0..<100 {
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            // A bound no running server comes near: a read that gets nothing fails the test.
            var limit = timeval(tv_sec: 30, tv_usec: 0)
            setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(port).bigEndian
            let connected = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            var first: UInt8 = 0
            guard connected, write(descriptor, startup, startup.count) == startup.count, read(descriptor, &first, 1) == 1 else {
                Glibc.close(descriptor)
                close()
                throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "no answer to a filler's startup message"])
            }
            if first == UInt8(ascii: "E") {
                Glibc.close(descriptor)
                return
            }
            descriptors.append(descriptor)
        }
        close()
        throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "the server took 100 connections without refusing one"])
    }

    mutating func close() {
        for descriptor in descriptors { Glibc.close(descriptor) }
        descriptors.removeAll()
    }
}

/// What a probe reads in the server's first message, from PostgreSQL 15's own bytes.
@Suite struct StartupProbeAnswerTests {
    /// `sorry, too many clients already`, as PostgreSQL 15 answered a startup message at its
    /// `max_connections` (captured from the tests' server).
    static let full = Array("E\u{0}\u{0}\u{0}USFATAL\u{0}VFATAL\u{0}C53300\u{0}Msorry, too many clients already\u{0}Fproc.c\u{0}L357\u{0}RInitProcess\u{0}\u{0}".utf8)
    /// `the database system is starting up` (57P03), the answer of a server not yet serving, laid
    /// out as PostgreSQL's protocol documentation gives an ErrorResponse ("Message Formats").
    static let starting = Array("E\u{0}\u{0}\u{0}\u{68}SFATAL\u{0}VFATAL\u{0}C57P03\u{0}Mthe database system is starting up\u{0}Fpostmaster.c\u{0}L2343\u{0}RProcessStartupPacket\u{0}\u{0}".utf8)
    /// An authentication request (SCRAM-SHA-256), as an accepting server answers.
    static let authentication = Array("R\u{0}\u{0}\u{0}\u{17}\u{0}\u{0}\u{0}\nSCRAM-SHA-256\u{0}\u{0}".utf8)

    @Test func theAnswersAreReadAsAcceptingFullOrRefusing() {
        #expect(StartupProbe.finding(ByteBuffer(bytes: Self.authentication)) == .accepting)
        #expect(StartupProbe.finding(ByteBuffer(bytes: Self.full)) == .full)
        #expect(StartupProbe.finding(ByteBuffer(bytes: Self.starting)) == .refusing)
        #expect(StartupProbe.finding(ByteBuffer(bytes: Array("N".utf8))) == .refusing)
    }

    @Test func anErrorCutShortIsReadOnceWholeAndAnOversizedOneRefuses() {
        // Cut anywhere, the error is not read until it is all there
        for cut in 1..<Self.full.count {
            #expect(StartupProbe.finding(ByteBuffer(bytes: Self.full.prefix(cut))) == nil, "cut at \(cut)")
        }
        // A length past any error PostgreSQL sends before authentication is not waited for
        #expect(StartupProbe.finding(ByteBuffer(bytes: [UInt8(ascii: "E"), 0, 1, 0, 0])) == .refusing)
    }
}

/// How probes that find no connection through add up to an outage (`UnreachableRun`), with the
/// probes' times passed in.
@Suite struct UnreachableRunTests {
    let start = ContinuousClock.now

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start.advanced(by: .milliseconds(milliseconds)) }

    @Test func probesStretchedByABusyMachineStillAddUpToTheUnreachableLimit() {
        // Given probes 1.2 s apart, as a busy machine stretches their 0.75 s cycle
        var run = UnreachableRun()
        var lengths: [Duration] = []
        for probe in 0...3 { lengths.append(run.notThrough(at: at(1_200 * probe))) }
        // Then they are one run, which reaches the limit by the fourth
        #expect(lengths == [.zero, .milliseconds(1_200), .milliseconds(2_400), .milliseconds(3_600)])
        #expect(lengths.last! >= PostgresOutage.unreachableLimit)
    }

    @Test func probesFarApartOrWithAnAnswerBetweenBeginTheRunAgain() {
        var run = UnreachableRun()
        _ = run.notThrough(at: at(0))
        // A probe long after the last says nothing about the time between them
        #expect(run.notThrough(at: at(10_000)) == .zero)
        #expect(run.notThrough(at: at(11_000)) == .milliseconds(1_000))
        // An answer ends the run
        run.answered()
        #expect(run.notThrough(at: at(12_000)) == .zero)
        #expect(run.notThrough(at: at(14_000)) == .milliseconds(2_000))
        #expect(run.notThrough(at: at(16_001)) == .zero)
    }

    @Test func oneSilenceIsNotAnOutageButTwoInARowAre() {
        // Given a probe whose connection went through and got no answer in its 2 s (a loaded
        // server slow to ask for authentication, or a frozen one)
        var run = UnreachableRun()
        let silence = Duration(PostgresOutage.silenceLimit)
        let first = run.notThrough(from: at(0), to: at(0) + silence)
        // Then that alone is short of the limit
        #expect(first == silence)
        #expect(first < PostgresOutage.unreachableLimit)
        // And the next probe, 0.25 s on, silent too, makes the run one that reaches it
        let second = run.notThrough(from: at(2_250), to: at(2_250) + silence)
        #expect(second == .milliseconds(2_250) + silence)
        #expect(second >= PostgresOutage.unreachableLimit)
        // While an answer between them begins the run again
        run.answered()
        #expect(run.notThrough(from: at(5_000), to: at(5_000) + silence) < PostgresOutage.unreachableLimit)
    }
}

extension UnreachableRun {
    /// Notes a probe without an answer that took no time, at `now` (as a probe whose connection
    /// was refused at once); the run's length.
    fileprivate mutating func notThrough(at now: ContinuousClock.Instant) -> Duration { notThrough(from: now, to: now) }
}
