import Foundation
import Logging
import Messages
import QuotaCore
import QuotaService
import Storage
import Testing
import TestSupport

/// The quota store's two implementations: every store test runs against both.
enum QuotaBackend: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// A fresh quota store of `backend` for the duration of `body`: SQLite in memory, or a new
/// database on the test PostgreSQL, migrated as the service migrates it.
func withQuotaStore<T>(
    _ backend: QuotaBackend, guests: GuestLimits = GuestLimits(), _ body: (QuotaStoreHarness) async throws -> T
) async throws -> T {
    switch backend {
    case .sqlite:
        return try await body(QuotaStoreHarness(store: try QuotaDatabase.inMemory(guests: guests)))
    case .postgres:
        let location = try await TestPostgres.freshDatabase()
        var logger = Logger(label: "test.quota")
        logger.logLevel = .warning
        try await PostgresPool.migrate(location, service: "quota", PostgresQuotaStore.migrations, logger: logger)
        return try await TestPostgres.withDatabase(location) { database in
            try await body(QuotaStoreHarness(store: PostgresQuotaStore(database: database, guests: guests, logger: logger)))
        }
    }
}

/// A store with the shorthands the tests use.
struct QuotaStoreHarness {
    let store: any QuotaStore

    func reserve(_ user: String, _ job: String, cost: Int = 1, network: String? = nil, at now: Date) async throws -> QuotaDecision {
        try await store.reserve(ReserveQuota(userId: user, jobId: job, cost: cost, network: network), now: now)
    }

    func status(_ user: String, at now: Date) async throws -> QuotaStatus {
        try await store.status(userId: user, now: now)
    }
}

/// The bus error `body` throws, or nil.
func busError(_ body: () async throws -> Void) async -> BusError? {
    do { try await body(); return nil } catch let error as BusError { return error } catch { return BusError(.internal, "\(error)") }
}
