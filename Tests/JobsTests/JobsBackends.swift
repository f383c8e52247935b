import Foundation
import GRDB
import JobsCore
@testable import JobsService
import Logging
import Messages
import PostgresNIO
import ServiceKit
import Storage
import Testing
import TestSupport

/// The jobs store's two implementations: the store tests that do not look at SQLite's own
/// machinery (its group commit, its rows) run against both.
enum JobsBackend: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// The test logger: warnings and worse.
let quietLogger = { var logger = Logger(label: "test.jobs"); logger.logLevel = .warning; return logger }()

/// A fresh jobs store of `backend` for the duration of `body`: SQLite in memory, or a new database
/// on the test PostgreSQL, migrated as the service migrates it.
func withJobsStore<T>(_ backend: JobsBackend, pushPlatforms: [PushPlatform] = [], _ body: (JobsStoreHarness) async throws -> T) async throws -> T {
    let retry = RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(10))
    let titles = ["copy": "Original"]
    switch backend {
    case .sqlite:
        let store = SQLiteJobsStore(database: try JobsDatabase.inMemory(), retry: retry, effectTitles: titles, pushPlatforms: pushPlatforms)
        return try await body(JobsStoreHarness(store: store, history: JobsHistoryFeed(store: store), settlements: JobsOutbox(database: store.database, topic: "quota"), outbox: {
            try await store.database.read { try OutboxEntry.order(Column("id")).fetchAll($0) }
        }))
    case .postgres:
        let location = try await TestPostgres.freshDatabase()
        try await PostgresPool.migrate(location, service: "jobs", PostgresJobsStore.migrations, logger: quietLogger)
        return try await TestPostgres.withDatabase(location) { database in
            let store = PostgresJobsStore(database: database, retry: retry, effectTitles: titles, pushPlatforms: pushPlatforms, logger: quietLogger)
            return try await body(JobsStoreHarness(
                store: store, history: PostgresJobsHistoryFeed(store: store), settlements: PostgresJobsOutbox(store: store, topic: "quota"),
                outbox: { try await PostgresOutboxRows.all(database) }
            ))
        }
    }
}

/// The outbox table on PostgreSQL, as `OutboxEntry`s.
enum PostgresOutboxRows {
    static func all(_ database: PostgresPool) async throws -> [OutboxEntry] {
        try await database.connection { db in
            try await db.allRows(
                "SELECT id, topic, kind, job_id, version, payload, created_at, attempts, next_attempt_at FROM jobs_outbox ORDER BY id",
                as: (Int64, String, String, String, Int, Data?, Double, Int, Double).self, logger: quietLogger
            ).map {
                OutboxEntry(id: $0.0, topic: $0.1, kind: $0.2, jobId: $0.3, version: $0.4, payload: $0.5,
                            createdAt: Date(timeIntervalSince1970: $0.6), attempts: $0.7, nextAttemptAt: Date(timeIntervalSince1970: $0.8))
            }
        }
    }
}

/// A store with the shorthands the tests use.
struct JobsStoreHarness {
    let store: any JobsStore
    /// History's events, as the relay reads them.
    let history: any Outbox<JobsOutboxKind>
    /// Quota's settlements, as their relay reads them.
    let settlements: any Outbox<JobsOutboxKind>
    let outbox: () async throws -> [OutboxEntry]
    let now = Date()

    func created(_ id: String = "job-1", user: String = "alice", imageKey: String = "uploads/x/y.jpg") async throws -> JobRecord {
        try await store.create(CreateJob(jobId: id, userId: user, isPro: false, imageKey: imageKey, effectId: "copy"), effectId: "copy", parameters: [:], now: now).job
    }

    func outbox() async throws -> [OutboxEntry] { try await outbox() }

    /// The job versions due for history now, with the events' ids.
    func dueForHistory(at time: Date? = nil) async throws -> [(id: String, event: JobEvent)] {
        try await history.due(now: time ?? now.addingTimeInterval(1), limit: 1000).compactMap { item in
            guard case .historyEvent(let event) = item.kind else { return nil }
            return (item.id, event)
        }
    }

    /// The files the blob janitor is told to delete.
    func discarded() async throws -> [String] {
        try await outbox().filter { $0.topic == "blobs" }.flatMap { try JSONDecoder().decode([String].self, from: $0.payload ?? Data()) }
    }
}
