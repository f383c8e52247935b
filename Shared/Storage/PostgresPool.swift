import Bus
import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

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
public final class PostgresPool: Service, Sendable {
    public let client: PostgresClient
    public let location: PostgresLocation
    public let logger: Logger

    public init(location: PostgresLocation, maximumConnections: Int = 20, logger: Logger) {
        var configuration = PostgresClient.Configuration(
            host: location.host, port: location.port, username: location.username, password: location.password,
            database: location.database, tls: .disable
        )
        configuration.options.maximumConnections = maximumConnections
        configuration.options.minimumConnections = 0
        // The pool's own lines (each failed attempt to connect, while the server is down) only
        // from warnings up: the stores say what failed, once, at the level that matters.
        var background = logger
        background.logLevel = max(logger.logLevel, .warning)
        self.client = PostgresClient(configuration: configuration, backgroundLogger: background)
        self.location = location
        self.logger = logger
    }

    /// Whether `run()` has started, and those waiting for it to.
    private let started = Mutex<(yes: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Runs the pool until the task is cancelled.
    public func run() async {
        let waiters = started.withLock { state in
            state.yes = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
        await client.run()
    }

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
    public static func migrate<T: Sendable>(
        _ location: PostgresLocation, service: String, _ migrations: [PostgresMigration], within limit: Duration = .seconds(20), logger: Logger,
        then: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { database in
            // The pool keeps trying a server that does not answer: the start gives up after `limit`.
            try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask {
                    try await database.migrate(service: service, migrations)
                    return try await database.client.withConnection(then)
                }
                group.addTask {
                    try await Task.sleep(for: limit)
                    throw PostgresLocationError(description: "\(location) did not answer within \(limit)")
                }
                defer { group.cancelAll() }
                guard let result = try await group.next(), let result else { throw CancellationError() }
                return result
            }
        }
    }

    /// Runs `body` on one connection of the pool, outside a transaction: for a single statement,
    /// or a session that lasts, such as a `LISTEN`.
    public func connection<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await client.withConnection(body)
    }

    /// Applies the migrations of `service` not applied yet, in order, each in a transaction,
    /// under an advisory lock: replicas starting together wait for the first, which migrates,
    /// and then find nothing left to do.
    public func migrate(service: String, _ migrations: [PostgresMigration]) async throws {
        try await client.withConnection { connection in
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
                        _ = try? await connection.query("ROLLBACK", logger: logger)
                        throw error
                    }
                    logger.info("database migrated", metadata: ["service": "\(service)", "migration": "\(migration.name)"])
                }
            } catch {
                _ = try? await connection.query("SELECT pg_advisory_unlock(hashtext(\(lock)))", logger: logger)
                throw error
            }
            try await connection.query("SELECT pg_advisory_unlock(hashtext(\(lock)))", logger: logger)
        }
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
        return try await client.withConnection { connection in
            switch isolation {
            case .readCommitted: try await connection.query("BEGIN", logger: logger)
            case .snapshotRead: try await connection.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger)
            }
            let result: T
            do {
                result = try await body(connection)
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw error
            }
            try await connection.query("COMMIT", logger: logger)
            return result
        }
    }
}

extension PostgresConnection {
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
