import Bus
import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import ServiceLifecycle
import Synchronization
import Tracing

/// Where a PostgreSQL database is, from a `postgres://user:password@host:port/database` URL (the
/// form `QUOTA_DATABASE_URL` and the others take). Its description leaves the password out.
public struct PostgresLocation: Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String

    /// Parses `url`; throws naming what is wrong (never the password).
    public init(url: String) throws {
        guard let parts = URLComponents(string: url), ["postgres", "postgresql"].contains(parts.scheme ?? ""),
              let host = parts.host, !host.isEmpty, let user = parts.user, !user.isEmpty
        else {
            throw PostgresLocationError(description: "a PostgreSQL URL is postgres://user:password@host:port/database")
        }
        let database = String(parts.path.drop { $0 == "/" })
        guard !database.isEmpty else { throw PostgresLocationError(description: "the PostgreSQL URL names no database") }
        self.host = host
        self.port = parts.port ?? 5432
        self.username = user.removingPercentEncoding ?? user
        self.password = parts.password.map { $0.removingPercentEncoding ?? $0 }
        self.database = database
    }

    public var description: String { "postgres://\(username)@\(host):\(port)/\(database)" }

    /// Parses the URL in `variable`; a malformed one is a `ConfigurationError` naming the
    /// variable and what is wrong, never the URL (it holds the password).
    public init(variable: String, url: String) throws {
        do {
            try self.init(url: url)
        } catch let error as PostgresLocationError {
            throw PostgresConfigurationError(description: "\(variable) is not usable: \(error.description)")
        }
    }
}

/// The database is down (its probe says so), or no connection came in time for the caller: no
/// connection was had, so nothing was done. Never names the password.
public struct PostgresUnavailable: Error, CustomStringConvertible {
    public var location: PostgresLocation
    public var description: String { "\(location) cannot be reached now" }

    /// Whether `error` says the connection or the server is gone (rather than a statement failed).
    public static func isConnectionLevel(_ error: PSQLError) -> Bool {
        [.connectionError, .serverClosedConnection, .uncleanShutdown, .clientClosedConnection, .poolClosed].contains(error.code)
    }
}

/// An operation that had its connection but did not finish in time for its caller: the caller is
/// answered and the operation left to end (a transaction is stopped by PostgreSQL at the same
/// deadline); whether a write in it committed is unknown.
public struct PostgresOperationTimedOut: Error, CustomStringConvertible {
    public var description: String { "the database did not answer in time" }
}

/// A malformed database URL, named by its variable.
public struct PostgresConfigurationError: Error, CustomStringConvertible {
    public var description: String
}

public struct PostgresLocationError: Error, CustomStringConvertible {
    public var description: String

    public init(description: String) { self.description = description }
}

/// One schema change of a service's tables: a name recorded once applied, and its statements,
/// run in one transaction.
public struct PostgresMigration: Sendable {
    public var name: String
    public var statements: [String]

    public init(_ name: String, _ statements: [String]) {
        self.name = name
        self.statements = statements
    }
}

/// A service's PostgreSQL: a pool of connections (postgres-nio's `PostgresClient`) that lives in
/// `run()` (a `Service`, listed before those that use it), migrations run once however many
/// replicas start together, and transactions.
///
/// **Outages fail fast.** postgres-nio's pool keeps trying a server it cannot reach, and a caller
/// waiting for a connection would wait until its own deadline (the gateway's 504 after 5 s). So an
/// operation that has waited `acquireLimit` for a connection has the server probed
/// (`PostgresOutage`: does it accept connections?); if it is down, the operation is given up and its
/// caller told `PostgresUnavailable` (nothing was done: the bus answers `unavailable`, the gateway
/// 503), and while it stays down every caller is told so at once. A server that is up but slow
/// is waited for. An operation made for a bus request gives up in time to answer it
/// (`BusDeadline`, less `answerMargin`): without a connection by then, unavailable; with one,
/// `PostgresOperationTimedOut` (it may have committed, so `storage_unavailable`), while its
/// transaction is stopped by PostgreSQL at the same deadline (`statement_timeout`). Outside a
/// request (relays, sweeps, the dispatcher's lease) only an outage ends the wait.
///
/// The waits are never cancelled. Each operation runs in a task of `run()`'s own, and its caller
/// awaits only its answer: a wait given up on stays in the pool's queue until a connection comes
/// (the operation then does nothing and gives it back) or the pool stops (which fails every wait).
/// Cancelling a waiting lease raced with its registration in the pool and could leave the canceller
/// waiting for ever. Nor is a connection in use ever closed (see `OperationWatch`).
public final class PostgresPool: Service, Sendable {
    public let client: PostgresClient
    public let location: PostgresLocation
    /// The one event loop of this pool, its connections' I/O and its operations (see `run()`):
    /// one of NIO's shared loops (one per core), taken in turn by the pools of a process.
    private let loop: any EventLoop
    public let logger: Logger
    /// This pool's bound on operations done for no request (`defaultBackgroundLimit` unless
    /// told otherwise).
    public let backgroundLimit: Duration

    /// How long an operation waits for a connection before the server is probed.
    public static let acquireLimit = Duration.seconds(1)

    /// How long before its request's deadline an operation gives up, for the answer to travel
    /// back: a second, or a quarter of the time left if that is less (`margin(within:)`). At
    /// 300 ms, the bound it had, answers given at that moment reached the gateway after its
    /// deadline when the machine was busy: a 504 at 5.02 s in `make hosts-chaos`
    /// (partition-leader-host-from-db: every call of the partition's first second was answered
    /// in the same few hundred milliseconds), and a 503 measured at 5.03 s by the chaos check's
    /// load generator.
    public static let answerMargin = Duration.seconds(1)

    /// The margin kept for the answer of an operation with `left` until its request's deadline.
    static func margin(within left: Duration) -> Duration { min(answerMargin, left / 4) }

    /// What an operation made for the current bus request may take (nil outside a request).
    static func timeForRequest() -> Duration? {
        BusDeadline.remaining(less: .zero).map { $0 - margin(within: $0) }
    }

    /// How long an operation done for no request (an outbox delivery, the dispatcher's reconcile
    /// and catch-up, a lease renewal) may take, waiting included, before its caller is told it
    /// timed out; its loop tries again. Without it, a wait for a connection that the pool never
    /// answers after a server restart (seen under the PostgreSQL-restart chaos check) held the
    /// leading jobs replica's dispatch forever: ending a term waits for every such operation.
    public static let defaultBackgroundLimit = Duration.seconds(30)

    /// How often a waiting operation looks at the probe's finding.
    static let checkEvery = Duration.milliseconds(100)

    /// The most operations at once, waiting or running, abandoned waits included; past it a caller
    /// is told the database is unavailable.
    public static let maximumOperations = 4_096

    /// Whether the server is down, and its probe.
    let outage: PostgresOutage

    /// The operations handed to `run()` and not started yet, whether it still takes them, and
    /// how many are waiting or running; `doorbell` tells `run()` there are some.
    private let intake = Mutex<(pending: [Operation], open: Bool, count: Int)>(([], true, 0))
    private let doorbell: AsyncStream<Void>
    private let ring: AsyncStream<Void>.Continuation

    /// `settings` are given to every connection at its start (PostgreSQL's startup parameters): a
    /// store's own planner settings (see `PostgresHistoryStore.sessionSettings`).
    public init(
        location: PostgresLocation, maximumConnections: Int = 20, backgroundLimit: Duration = defaultBackgroundLimit,
        settings: [(String, String)] = [], logger: Logger
    ) {
        self.backgroundLimit = backgroundLimit
        var configuration = PostgresClient.Configuration(
            host: location.host, port: location.port, username: location.username, password: location.password,
            database: location.database, tls: .disable
        )
        configuration.options.maximumConnections = maximumConnections
        // At least one: postgres-nio's pool makes a new connection, when one closes, only to stay at
        // its minimum, not for the calls queued for one; with none, calls queued while the last
        // connection was closed (PostgreSQL restarted, or an operation abandoned) would wait for
        // the next call to make one.
        configuration.options.minimumConnections = 1
        // A session whose client went silent inside a transaction (its host cut off from the
        // database by a partition: its packets dropped, its connection not closed) is ended by the
        // server after 5 s, and its locks with it: else the other replicas' transactions on the
        // same rows (a user's quota, a job) waited until the partition healed. No transaction here
        // waits between its statements: they are sent one after another.
        configuration.options.additionalStartupParameters = [("idle_in_transaction_session_timeout", "5s")] + settings
        // The pool's own lines (each failed attempt to connect, while the server is down) only
        // from warnings up: the stores say what failed, once, at the level that matters. Not its
        // warning of a lease before its `run()`: operations start with the pool's own run, and
        // one may reach postgres-nio's pool a moment before its run has started; the lease waits
        // for it, as it should.
        var background = Logger(label: logger.label) { [handler = logger.handler] _ in LeaseBeforeRunUnlogged(wrapped: handler) }
        background.logLevel = max(logger.logLevel, .warning)
        loop = MultiThreadedEventLoopGroup.singleton.next()
        self.client = PostgresClient(configuration: configuration, eventLoopGroup: loop, backgroundLogger: background)
        self.location = location
        self.logger = logger
        self.outage = PostgresOutage(
            host: location.host, port: location.port, username: location.username, database: location.database, logger: logger)
        (doorbell, ring) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Whether `run()` has started, and those waiting for it to.
    private let started = Mutex<(yes: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Runs the pool, and the operations of its callers, until the task is cancelled or a
    /// graceful shutdown reaches it.
    public func run() async {
        let waiters = started.withLock { state in
            state.yes = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
        // The operations run in a task that the run's cancellation does not reach. Cancelling an
        // operation whose lease waits in postgres-nio's pool races with its registration there,
        // and the loser waits for ever: at a stop after an outage (waits given up on still
        // queued), the run never ended (a test's teardown hung; a jobs service did not exit on
        // SIGTERM with its PostgreSQL stopped first). Instead, the stop shuts postgres-nio's pool
        // down first (its `run()` cancelled), which fails every queued lease, and then waits for
        // the operations, which end with them (within `stopGrace`: see below).
        //
        // They run on the pool's own event loop, the one its connections' I/O runs on: a statement
        // written from there is sent without waking the loop, and its answer resumes the operation
        // on the thread that read it. On Swift's pool instead, each of a transaction's statements
        // cost two thread wake-ups (the loop's, then a pool thread's): in the quota service on
        // PostgreSQL they were a third of its CPU (perf). An operation's body only builds
        // statements and reads their rows: it never blocks. (One that reaches postgres-nio's pool
        // before its `run()` has started waits for it.)
        let (stopping, stop) = AsyncStream<Bool>.makeStream()
        let operations = Task(executorPreference: EventLoopTaskExecutor(loop)) {
            defer { stop.yield(true) }
            await withDiscardingTaskGroup { group in
                // Ends when the doorbell is finished, once the pool has stopped.
                for await _ in self.doorbell {
                    let operations = self.intake.withLock { intake in
                        defer { intake.pending.removeAll() }
                        return intake.pending
                    }
                    for operation in operations {
                        group.addTask {
                            await operation.run()
                            self.intake.withLock { $0.count -= 1 }
                        }
                    }
                }
            }
        }
        await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.client.run() }
                group.addTask { await self.outage.run() }
            }
        }
        // Those not started are told the pool has stopped, as are those handed in from now on.
        let left = intake.withLock { intake in
            intake.open = false
            intake.count -= intake.pending.count
            defer { intake.pending.removeAll() }
            return intake.pending
        }
        for operation in left { operation.stopped() }
        ring.finish()
        // Every operation ends at once now (their waits failed, their connections closed), except
        // one whose statement was written to a closed connection, which never will (see
        // `Leased`): after `stopGrace`, the stop goes on without it, saying so. The wait is a task
        // of its own, awaited: the run's own task may be cancelled (a pool run for the span of a
        // body is), and an iterator of a cancelled task ends at once, as if all had stopped.
        let timer = Task {
            if (try? await Task.sleep(for: Self.stopGrace)) != nil { stop.yield(false) }
        }
        let ended = await Task {
            var stopped = stopping.makeAsyncIterator()
            return await stopped.next() ?? false
        }.value
        timer.cancel()
        await timer.value
        if ended {
            await operations.value
        } else {
            let stuck = intake.withLock { $0.count }
            logger.error("database pool stopped with operations that will never end (a statement written to a closed connection)", metadata: [
                "database": "\(location)", "operations": "\(stuck)",
            ])
        }
    }

    /// How long a stop waits for the operations still running once the pool has shut down.
    static let stopGrace = Duration.seconds(5)

    /// Runs the pool for the duration of `body`, which starts once the pool runs.
    @discardableResult
    public func running<T>(isolation: isolated (any Actor)? = #isolation, _ body: (PostgresPool) async throws -> T) async throws -> T {
        try await whileRunning(isolation: isolation, { await self.run() }) {
            await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
                let yes = started.withLock { state -> Bool in
                    if !state.yes { state.waiters.append(waiter) }
                    return state.yes
                }
                if yes { waiter.resume() }
            }
            return try await body(self)
        }
    }

    /// Applies the migrations of `service` at `location` with a pool of its own, run for as long
    /// as that takes: what a process does at start, before it serves (a database it cannot
    /// reach or migrate stops it there, saying why).
    public static func migrate(
        _ location: PostgresLocation, service: String, _ migrations: [PostgresMigration], within limit: Duration = .seconds(20), logger: Logger
    ) async throws {
        try await migrate(location, service: service, migrations, within: limit, logger: logger) { _ in }
    }

    /// Applies the migrations, then runs `then` on the same connection (what a store reads once
    /// at start), all within `limit`.
    ///
    /// A server that is down or does not answer is tried again until `limit` has passed. The wait
    /// for a connection goes through `connection(limit:)`, so it is never cancelled: cancelling a
    /// waiting lease of postgres-nio's pool races with its registration there, and the loser
    /// may wait for a connection for ever. (The migration's wait was cancelled by a timer, and by
    /// a caller that threw: the test run that hung on a fresh machine stood still in a test whose
    /// two replicas migrate together, `async let`, the second cancelled as the first threw.)
    public static func migrate<T: Sendable>(
        _ location: PostgresLocation, service: String, _ migrations: [PostgresMigration], within limit: Duration = .seconds(20), logger: Logger,
        then: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { database in
            let deadline = ContinuousClock.now.advanced(by: limit)
            while true {
                do {
                    return try await database.connection(limit: ContinuousClock.now.duration(to: deadline)) { connection in
                        try await migrate(connection, service: service, migrations, logger: logger)
                        return try await then(connection)
                    }
                } catch is PostgresUnavailable where ContinuousClock.now < deadline {
                    // Down, or too busy to give a connection yet: again, until the limit.
                    try await Task.sleep(for: PostgresOutage.probeEvery)
                } catch is PostgresUnavailable, is PostgresOperationTimedOut {
                    throw PostgresLocationError(description: "\(location) did not answer within \(limit)")
                }
            }
        }
    }

    /// Runs `body` on one connection of the pool, outside a transaction: for a single statement.
    /// It fails fast while the server is down, and gives up after `limit` (nil: in time for the
    /// current bus request's deadline, or after `backgroundLimit` outside a request); see the
    /// type's notes.
    public func connection<T: Sendable>(
        limit: Duration? = nil, _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        try await leased(limit: limit, body)
    }

    /// Runs `body` on one connection for as long as it takes: a session that lasts, such as a
    /// `LISTEN`, or a bulk load. It waits for the server however long it is down, and cancelling
    /// the task is how it ends; not for a request's path.
    public func session<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await client.withConnection(body)
    }

    /// Hands `body` to `run()`, which runs it as one of its operations: on the pool's event loop,
    /// and waited for by the pool's stop. `body` holds no connection of its own (it makes its own
    /// calls of the pool). False if the pool has stopped or has `maximumOperations` already: then
    /// `body` never runs, nor does `stopped`. `stopped` is called instead of `body` if the pool
    /// stops before `body` has started.
    func launch(_ body: @escaping @Sendable () async -> Void, stopped: @escaping @Sendable () -> Void) -> Bool {
        enqueue(Operation(run: body, stopped: stopped))
    }

    /// Hands `operation` to `run()`; false if the pool has stopped or has `maximumOperations`.
    private func enqueue(_ operation: Operation) -> Bool {
        let taken = intake.withLock { intake -> Bool in
            guard intake.open, intake.count < Self.maximumOperations else { return false }
            intake.count += 1
            intake.pending.append(operation)
            return true
        }
        if taken { ring.yield() }
        return taken
    }

    /// Runs `body` on a connection of the pool, failing fast while the server is down and giving
    /// up after `limit` or the current request's deadline (see the type's notes).
    func leased<T: Sendable>(limit: Duration?, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        guard !outage.isDown else { throw PostgresUnavailable(location: location) }
        let allowed = limit ?? Self.timeForRequest() ?? backgroundLimit
        let end: ContinuousClock.Instant? = ContinuousClock.now.advanced(by: max(allowed, .zero))
        let outcome = await withCheckedContinuation { (caller: CheckedContinuation<Result<T, any Error>, Never>) in
            let answer = Answer(caller)
            let operation = Operation(
                run: { [client, loop, location, outage] in
                    await Self.attempt(client: client, loop: loop, location: location, outage: outage, end: end, body: body, answer: answer)
                },
                stopped: { [location] in answer.give(.failure(PostgresUnavailable(location: location))) }
            )
            if !enqueue(operation) { operation.stopped() }
        }
        // A connection lost: the server may be gone.
        if case .failure(let error as PSQLError) = outcome, PostgresUnavailable.isConnectionLevel(error) { outage.suspect() }
        if case .failure(is PostgresUnavailable) = outcome { outage.suspect() }
        return try outcome.get()
    }

    /// One caller's operation, run by `run()` in a task of its own: the wait for a connection and
    /// `body`, watched meanwhile by an `OperationWatch`, which answers the caller when the server is
    /// found down or `end` passes. The wait is never cancelled; the watch is, once the operation
    /// has ended.
    private static func attempt<T: Sendable>(
        client: PostgresClient, loop: any EventLoop, location: PostgresLocation, outage: PostgresOutage, end: ContinuousClock.Instant?,
        body: @escaping @Sendable (PostgresConnection) async throws -> T, answer: Answer<T>
    ) async {
        let lease = LeaseState()
        let watch = OperationWatch(loop: loop, lease: lease, location: location, outage: outage, end: end, answer: answer)
        // The watch's end leaves the operation to finish; the operation's end stops the watch.
        defer { watch.stop() }
        do {
            while true {
                let leased = try await client.withConnection { connection -> Leased<T> in
                    // A connection whose close the pool has not heard of yet: see `Leased`.
                    guard !connection.isClosed else { return .closed }
                    // Too late (the caller was told nothing was done): do nothing.
                    guard lease.acquire(connection) else { throw CancellationError() }
                    return .done(try await body(connection))
                }
                if case .done(let value) = leased {
                    answer.give(.success(value))
                    return
                }
                guard !lease.isAbandoned else { throw CancellationError() }
                try await Task.sleep(for: closedConnectionPause)
            }
        } catch {
            answer.give(.failure(error))
        }
    }

    /// Applies the migrations of `service` not applied yet, in order, each in a transaction,
    /// under an advisory lock: replicas starting together wait for the first, which migrates,
    /// and then find nothing left to do.
    public func migrate(service: String, _ migrations: [PostgresMigration]) async throws {
        try await connection(limit: .seconds(60)) { [logger] connection in
            try await Self.migrate(connection, service: service, migrations, logger: logger)
        }
    }

    /// `migrate(service:_:)` on `connection`.
    static func migrate(_ connection: PostgresConnection, service: String, _ migrations: [PostgresMigration], logger: Logger) async throws {
        let lock = "photoedit-migrations"
        try await connection.query("SELECT pg_advisory_lock(hashtext(\(lock)))", logger: logger)
        do {
            try await connection.query("""
                CREATE TABLE IF NOT EXISTS schema_migration (
                    service text NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
                    PRIMARY KEY (service, name))
                """, logger: logger)
            var applied = Set<String>()
            for try await name in try await connection.query(
                "SELECT name FROM schema_migration WHERE service = \(service)", logger: logger
            ).decode(String.self) {
                applied.insert(name)
            }
            for migration in migrations where !applied.contains(migration.name) {
                try await connection.query("BEGIN", logger: logger)
                do {
                    for statement in migration.statements {
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                    try await connection.query(
                        "INSERT INTO schema_migration (service, name) VALUES (\(service), \(migration.name))", logger: logger
                    )
                    try await connection.query("COMMIT", logger: logger)
                } catch {
                    await connection.rollBackUnlessClosed(logger: logger)
                    throw error
                }
                logger.info("database migrated", metadata: ["service": "\(service)", "migration": "\(migration.name)"])
            }
        } catch {
            if !connection.isClosed { _ = try? await connection.query("SELECT pg_advisory_unlock(hashtext(\(lock)))", logger: logger) }
            throw error
        }
        try await connection.query("SELECT pg_advisory_unlock(hashtext(\(lock)))", logger: logger)
    }

    /// How a transaction sees others.
    public enum Isolation: Sendable {
        /// Each statement sees what was committed before it (PostgreSQL's default): for writes,
        /// which take their own locks.
        case readCommitted
        /// Every statement sees the one snapshot taken at the first, and nothing is written: for
        /// reads made of several statements that must agree.
        case snapshotRead
    }

    /// Runs `body` in one transaction: committed (durably: `synchronous_commit` is on) when it
    /// returns, rolled back when it throws.
    public func transaction<T: Sendable>(
        _ isolation: Isolation = .readCommitted, _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let logger = logger
        let location = location
        // A bus request's transaction is stopped by PostgreSQL itself once its deadline passes.
        let timeout = Self.timeForRequest().map { max(1, $0.wholeMilliseconds) }
        // The operation runs in a task of the pool's: the request's trace is handed over.
        let traceParent = BusTracing.currentTraceParent()
        return try await leased(limit: nil) { connection in
            try await BusTracing.childSpan("postgres.transaction", of: traceParent, ofKind: .client, attributes: ["db.system": "postgresql"]) {
                switch isolation {
                case .readCommitted: try await connection.query("BEGIN", logger: logger)
                case .snapshotRead: try await connection.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger)
                }
                if let timeout {
                    do {
                        try await connection.query(PostgresQuery(unsafeSQL: "SET LOCAL statement_timeout = \(timeout)"), logger: logger)
                    } catch {
                        await connection.rollBackUnlessClosed(logger: logger)
                        throw error
                    }
                }
                let result: T
                do {
                    result = try await body(connection)
                } catch {
                    await connection.rollBackUnlessClosed(logger: logger)
                    throw error
                }
                // Closed since (the server dropped it, and the transaction with it): nothing was
                // committed, and a COMMIT written to it would never be answered (see `Leased`).
                guard !connection.isClosed else { throw PostgresUnavailable(location: location) }
                try await connection.query("COMMIT", logger: logger)
                return result
            }
        }
    }

    /// Runs `body` on one connection outside a transaction, as `connection(limit:_:)`, handing
    /// it the request's timeout in milliseconds (nil outside a bus request): for one call of a
    /// procedure that commits by itself (`CALL` of one that ends in `COMMIT`, answered once the
    /// commit is durable), one round trip where BEGIN, a statement and COMMIT are three. The
    /// procedure sets the timeout itself (`set_config('lock_timeout', …, true)`: PostgreSQL reads
    /// `lock_timeout` when a wait begins, so the call's own lock waits are bounded).
    public func connectionSettingItsTimeout<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection, _ timeoutMilliseconds: Int?) async throws -> T
    ) async throws -> T {
        let timeout = Self.timeForRequest().map { Int(max(1, $0.wholeMilliseconds)) }
        // The operation runs in a task of the pool's: the request's trace is handed over.
        let traceParent = BusTracing.currentTraceParent()
        return try await leased(limit: nil) { connection in
            try await BusTracing.childSpan("postgres.call", of: traceParent, ofKind: .client, attributes: ["db.system": "postgresql"]) {
                try await body(connection, timeout)
            }
        }
    }
}

/// An operation handed to `run()`: what it does, and how it is told the pool has stopped.
struct Operation: Sendable {
    var run: @Sendable () async -> Void
    var stopped: @Sendable () -> Void
}

/// What an operation's lease came to. postgres-nio (1.33) can hand out a connection that has
/// closed (the server dropped it) before its pool has heard of the close, and a statement written
/// to a closed connection is never answered: its task never reaches the connection's handler, so
/// the caller's await never ends (and a stop waiting for that operation never would either). So an
/// operation handed a closed connection gives it back and asks for another, and no statement of
/// the pool's own (ROLLBACK, COMMIT, an unlock) is written to a connection found closed.
enum Leased<T: Sendable>: Sendable {
    case done(T)
    case closed
}

/// How long an operation handed a closed connection waits before asking for another (the pool
/// hears of the close meanwhile).
let closedConnectionPause = Duration.milliseconds(5)

/// A caller's answer, given once: by the operation, or by its watch first (`OperationWatch`).
final class Answer<T: Sendable>: Sendable {
    private let caller: Mutex<CheckedContinuation<Result<T, any Error>, Never>?>

    init(_ caller: CheckedContinuation<Result<T, any Error>, Never>) { self.caller = Mutex(caller) }

    func give(_ outcome: Result<T, any Error>) {
        caller.withLock { caller in
            defer { caller = nil }
            return caller
        }?.resume(returning: outcome)
    }
}

/// Whether a caller's connection came in time: the body starts only if the wait was not given
/// up first, so "no connection" always means nothing was done.
final class LeaseState: Sendable {
    private enum State { case waiting, acquired(PostgresConnection), abandoned }
    private let state = Mutex(State.waiting)

    /// The connection came: true if the caller still waits for it.
    func acquire(_ connection: PostgresConnection) -> Bool {
        state.withLock { state in
            guard case .waiting = state else { return false }
            state = .acquired(connection)
            return true
        }
    }

    /// Whether the caller stopped waiting before a connection came.
    var isAbandoned: Bool {
        state.withLock { state in
            if case .abandoned = state { return true }
            return false
        }
    }

    /// The wait is over: the connection if it came, else nil (and it never will be used).
    func abandonUnlessAcquired() -> PostgresConnection? {
        state.withLock { state in
            if case .acquired(let connection) = state { return connection }
            state = .abandoned
            return nil
        }
    }
}

/// An operation's timer (see `PostgresPool.attempt`): after `acquireLimit` (or at the operation's
/// end, if sooner), has the server probed; without a connection, gives the operation up if the
/// server is down or `end` has passed; with one, answers the caller at `end` or once the server is
/// found down or frozen (the operation has outlasted `acquireLimit`: the server is probed), as
/// timed out: it may have committed. The operation finishes in its own time (a transaction's
/// statements are stopped by PostgreSQL at the same deadline: see `transaction`; a frozen
/// server's, once it runs again). Closing its connection instead raced with postgres-nio's pool,
/// which could hand the closed connection to the next caller, whose query then never ended.
///
/// Its checks are callbacks on the pool's event loop, not a task: a task of its own with a
/// `Task.sleep` for every operation (a timer of Dispatch's, which fires even once cancelled) were
/// a thread wake-up and a task per page of history (see docs/history.md).
final class OperationWatch<T: Sendable>: NIOScheduledCallbackHandler, Sendable {
    private let loop: any EventLoop
    private let lease: LeaseState
    private let location: PostgresLocation
    private let outage: PostgresOutage
    private let end: ContinuousClock.Instant?
    private let answer: Answer<T>
    /// The next check, and whether the watch has stopped (no check is made once it has).
    private let next = Mutex<(check: NIOScheduledCallback?, stopped: Bool)>((nil, false))

    /// Starts watching: the first check after `acquireLimit`.
    init(loop: any EventLoop, lease: LeaseState, location: PostgresLocation, outage: PostgresOutage, end: ContinuousClock.Instant?, answer: Answer<T>) {
        (self.loop, self.lease, self.location, self.outage, self.end, self.answer) = (loop, lease, location, outage, end, answer)
        schedule(after: PostgresPool.acquireLimit)
    }

    /// The operation has ended: no more checks (and no reference to the watch is left on the loop).
    func stop() {
        let check = next.withLock { next in
            next.stopped = true
            defer { next.check = nil }
            return next.check
        }
        check?.cancel()
    }

    /// The next check after `duration`, or at `end` if sooner.
    private func schedule(after duration: Duration) {
        let now = ContinuousClock.now
        let until = end.map { min($0, now.advanced(by: duration)) } ?? now.advanced(by: duration)
        let delay = TimeAmount(max(.zero, now.duration(to: until)))
        next.withLock { next in
            guard !next.stopped else { return }
            // (It throws only once the loop has shut down: NIO's shared loops never do.)
            next.check = try? loop.scheduleCallback(at: .now() + delay, handler: self)
        }
    }

    private var passed: Bool { end.map { ContinuousClock.now >= $0 } ?? false }

    /// A check: with or without a connection, the server probed and a check again while it is
    /// not found down and `end` has not passed; then the caller answered, as unavailable if no
    /// connection came (and none will be used), else as timed out.
    func handleScheduledCallback(eventLoop: some EventLoop) {
        guard outage.isDown || passed else {
            outage.suspect()
            schedule(after: PostgresPool.checkEvery)
            return
        }
        if lease.abandonUnlessAcquired() == nil {
            answer.give(.failure(PostgresUnavailable(location: location)))
        } else {
            answer.give(.failure(PostgresOperationTimedOut()))
        }
    }
}

extension PostgresConnection {
    /// Rolls the open transaction back, unless the connection has closed (which ended it, and a
    /// statement written to it would never be answered: see `Leased`).
    func rollBackUnlessClosed(logger: Logger) async {
        guard !isClosed else { return }
        _ = try? await query("ROLLBACK", logger: logger)
    }

    /// The first row of `query` decoded as `T`, or nil.
    public func first<T: PostgresDecodable & Sendable>(_ query: PostgresQuery, as type: T.Type, logger: Logger) async throws -> T? {
        for try await value in try await self.query(query, logger: logger).decode(T.self) { return value }
        return nil
    }

    /// Every row of `query` decoded as `T`.
    public func all<T: PostgresDecodable & Sendable>(_ query: PostgresQuery, as type: T.Type, logger: Logger) async throws -> [T] {
        var values: [T] = []
        for try await value in try await self.query(query, logger: logger).decode(T.self) { values.append(value) }
        return values
    }

    /// The first row of `query` decoded as a tuple of `Column`s, or nil.
    public func firstRow<each Column: PostgresDecodable & Sendable>(
        _ query: PostgresQuery, as type: (repeat each Column).Type, logger: Logger
    ) async throws -> (repeat each Column)? {
        for try await row in try await self.query(query, logger: logger).decode((repeat each Column).self) { return row }
        return nil
    }

    /// Every row of `query` decoded as a tuple of `Column`s.
    public func allRows<each Column: PostgresDecodable & Sendable>(
        _ query: PostgresQuery, as type: (repeat each Column).Type, logger: Logger
    ) async throws -> [(repeat each Column)] {
        var rows: [(repeat each Column)] = []
        for try await row in try await self.query(query, logger: logger).decode((repeat each Column).self) { rows.append(row) }
        return rows
    }
}

/// A log handler that passes every line on except postgres-nio's warning of a lease asked for
/// before its pool's `run()` (see `PostgresPool.init`).
struct LeaseBeforeRunUnlogged: LogHandler {
    var wrapped: any LogHandler

    var logLevel: Logger.Level {
        get { wrapped.logLevel }
        set { wrapped.logLevel = newValue }
    }

    var metadata: Logger.Metadata {
        get { wrapped.metadata }
        set { wrapped.metadata = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { wrapped[metadataKey: key] }
        set { wrapped[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) {
        if event.level == .warning, event.message.description.hasPrefix("Trying to lease connection from `PostgresClient`") { return }
        wrapped.log(event: event)
    }
}
