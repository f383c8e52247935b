import Bus
import Foundation
import Logging
import PostgresNIO
import Storage

/// The PostgreSQL the test scripts started (`scripts/with-postgres.sh`, which `make test` uses):
/// its URL comes in `PHOTOEDIT_TEST_POSTGRES_ENV`, the `postgres.env` file
/// `scripts/postgres-server.sh` wrote.
public enum TestPostgres {
    public struct Missing: Error, CustomStringConvertible {
        public var description: String { "no test PostgreSQL: run the tests through `make test` or `scripts/with-postgres.sh swift test ...`" }
    }

    /// The server's own database, where fresh ones are made.
    public static func location() throws -> PostgresLocation {
        guard let path = ProcessInfo.processInfo.environment["PHOTOEDIT_TEST_POSTGRES_ENV"],
              let text = try? String(contentsOfFile: path, encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("POSTGRES_URL=") })
        else { throw Missing() }
        return try PostgresLocation(url: String(line.dropFirst("POSTGRES_URL=".count)))
    }

    /// A new, empty database on the test server, for one test: tests never share tables.
    public static func freshDatabase() async throws -> PostgresLocation {
        var location = try location()
        let name = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        var logger = Logger(label: "test.postgres")
        logger.logLevel = .warning
        // Through the pool's own lease, which is never cancelled (see `PostgresPool`), with a
        // bound no loaded machine comes near: past it the test fails naming the server.
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { admin in
            try await admin.connection(limit: .seconds(120)) { [logger] db in
                _ = try await db.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"), logger: logger)
            }
        }
        location.database = name
        return location
    }

    /// `location` as a URL with its password, as a process is given it (`QUOTA_DATABASE_URL`).
    public static func url(_ location: PostgresLocation) -> String {
        "postgres://\(location.username):\(location.password ?? "")@\(location.host):\(location.port)/\(location.database)"
    }

    /// Runs a pool of `location` (at most `maximumConnections`, each started with `settings`) for
    /// the duration of `body`.
    public static func withDatabase<T>(
        _ location: PostgresLocation, maximumConnections: Int = 20, settings: [(String, String)] = [], _ body: (PostgresPool) async throws -> T
    ) async throws -> T {
        var logger = Logger(label: "test.postgres")
        logger.logLevel = .warning
        return try await PostgresPool(location: location, maximumConnections: maximumConnections, settings: settings, logger: logger).running(body)
    }

    /// How many times `body` scanned any of `tables` whole, on `db`: `body` runs in a transaction
    /// of its own, and this transaction's sequential scans (`pg_stat_xact_user_tables`) are
    /// counted before and after it (PostgreSQL 15 adds to them the ones it has not published yet).
    public static func sequentialScans(
        _ db: PostgresConnection, of tables: [String], logger: Logger, during body: () async throws -> Void
    ) async throws -> Int {
        func count() async throws -> Int {
            try await db.first(
                "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_xact_user_tables WHERE relname = ANY(\(tables)::text[])",
                as: Int.self, logger: logger
            ) ?? 0
        }
        try await db.query("BEGIN", logger: logger)
        do {
            let before = try await count()
            try await body()
            let after = try await count()
            try await db.query("COMMIT", logger: logger)
            return after - before
        } catch {
            _ = try? await db.query("ROLLBACK", logger: logger)
            throw error
        }
    }

    /// As `sequentialScans(_:of:logger:during:)`, for a `body` that commits by itself (the call of
    /// a procedure that ends in `COMMIT`, which a transaction block around it would refuse): the
    /// scans are counted from the statistics PostgreSQL has published, each count made after
    /// this connection's own are flushed (`pg_stat_force_next_flush`, PostgreSQL 15: at its next
    /// idle moment, before the statement after it). Only this connection may touch `tables`
    /// meanwhile.
    public static func sequentialScansAcrossCommits(
        _ db: PostgresConnection, of tables: [String], logger: Logger, during body: () async throws -> Void
    ) async throws -> Int {
        func count() async throws -> Int {
            try await db.query("SELECT pg_stat_force_next_flush()", logger: logger)
            return try await db.first(
                "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_user_tables WHERE relname = ANY(\(tables)::text[])",
                as: Int.self, logger: logger
            ) ?? 0
        }
        let before = try await count()
        try await body()
        return try await count() - before
    }
}
