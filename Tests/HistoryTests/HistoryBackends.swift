import Foundation
import HistoryService
import Logging
import Storage
import Testing
import TestSupport

/// The history store's two implementations: every store test runs against both.
enum HistoryBackend: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// A fresh history store of `backend` for the duration of `body`: SQLite in memory, or a new
/// database on the test PostgreSQL, migrated and keyed as the service does it at start; each
/// searching by reading a history of up to `scanUpTo` items, the trigram index past that.
func withHistoryStore<T>(_ backend: HistoryBackend, scanUpTo: Int = 10_000, _ body: (any HistoryStore) async throws -> T) async throws -> T {
    switch backend {
    case .sqlite:
        return try await body(try HistoryDatabase.inMemory(scanUpTo: scanUpTo))
    case .postgres:
        let location = try await TestPostgres.freshDatabase()
        var logger = Logger(label: "test.history")
        logger.logLevel = .warning
        let key = try await PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { [logger] db in
            try await PostgresHistoryStore.tokenKey(db, logger: logger)
        }
        return try await TestPostgres.withDatabase(location, settings: PostgresHistoryStore.sessionSettings) { database in
            try await body(PostgresHistoryStore(database: database, tokenKey: key, scanUpTo: scanUpTo, logger: logger))
        }
    }
}
