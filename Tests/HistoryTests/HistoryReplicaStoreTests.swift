import Foundation
import HistoryService
import Logging
import Messages
import Storage
import Testing
import TestSupport

/// Two history replicas over one PostgreSQL database: two stores with pools of their own, each
/// keyed and migrated as a process does it at start.
@Suite("History replicas on PostgreSQL", .timeLimit(.minutes(5)))
struct HistoryReplicaStoreTests {
    func withReplicas<T>(_ body: (PostgresHistoryStore, PostgresHistoryStore) async throws -> T) async throws -> T {
        let location = try await TestPostgres.freshDatabase()
        let logger = { var logger = Logger(label: "test.history"); logger.logLevel = .warning; return logger }()
        // Both start together: the migration runs once, and the token key is the first's.
        async let first = PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { [logger] db in
            try await PostgresHistoryStore.tokenKey(db, logger: logger)
        }
        async let second = PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { [logger] db in
            try await PostgresHistoryStore.tokenKey(db, logger: logger)
        }
        let (keyA, keyB) = try await (first, second)
        #expect(keyA == keyB)
        return try await TestPostgres.withDatabase(location, settings: PostgresHistoryStore.sessionSettings) { a in
            try await TestPostgres.withDatabase(location, settings: PostgresHistoryStore.sessionSettings) { b in
                try await body(PostgresHistoryStore(database: a, tokenKey: keyA, logger: logger), PostgresHistoryStore(database: b, tokenKey: keyB, logger: logger))
            }
        }
    }

    @Test func eventsSpreadOverBothReplicasEndAtEachJobsNewestVersionAndTheFeedMissesNothing() async throws {
        try await withReplicas { a, b in
            // 40 jobs of one user, each through queued, processing, completed (versions 1-3),
            // every event sent alone to either replica, all at once and in no particular order.
            let jobs = (0..<40).map { String(format: "job-%02d", $0) }
            let statuses: [JobStatus] = [.queued, .processing, .completed]
            var events = jobs.flatMap { job in statuses.enumerated().map { Events.job(job, status: $1, version: $0 + 1) } }
            var generator = SystemRandomNumberGenerator()
            events.shuffle(using: &generator)
            let stores: [any HistoryStore] = [a, b]
            // A client follows the changes feed from the other replica while the writes happen.
            async let followed: [String: Int] = {
                var seen: [String: Int] = [:]
                var token: String? = nil
                let deadline = ContinuousClock.now + .seconds(30)
                while ContinuousClock.now < deadline, seen.count < jobs.count || seen.values.contains(where: { $0 < 3 }) {
                    let changes = try await b.changes(ChangesSince(userId: "u1", token: token, limit: 7))
                    for change in changes.changes { if let item = change.item { seen[item.jobId] = item.version } }
                    token = changes.nextToken
                    if changes.changes.isEmpty { try await Task.sleep(for: .milliseconds(5)) }
                }
                return seen
            }()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, event) in events.enumerated() {
                    group.addTask { _ = try await stores[index % 2].applyJobEvents([event]) }
                }
                try await group.waitForAll()
            }
            // Every job at version 3, counted once, whichever replica is asked.
            for store in stores {
                let page = try await store.page(ListHistory(userId: "u1", limit: 100))
                #expect(page.totalCount == jobs.count)
                #expect(page.items.allSatisfy { $0.version == 3 && $0.status == .completed })
                #expect(try await store.page(ListHistory(userId: "u1", statuses: [.completed])).totalCount == jobs.count)
                #expect(try await store.page(ListHistory(userId: "u1", statuses: [.processing])).totalCount == 0)
            }
            // The feed, read in small pages during the writes, reached every job's last version.
            let seen = try await followed
            #expect(seen.count == jobs.count)
            #expect(seen.values.allSatisfy { $0 == 3 })
        }
    }

    @Test func aCursorOrTokenFromOneReplicaOpensOnTheOther() async throws {
        try await withReplicas { a, b in
            _ = try await a.applyJobEvents((0..<30).map { Events.job("j\($0)", createdAt: Events.epoch.addingTimeInterval(Double($0))) })
            let first = try await a.page(ListHistory(userId: "u1", limit: 10))
            let second = try await b.page(ListHistory(userId: "u1", limit: 10, cursor: first.nextCursor))
            #expect(second.items.first?.jobId == "j19")
            let token = try await a.changes(ChangesSince(userId: "u1")).nextToken
            _ = try await b.deleteItem("j0", userId: "u1", now: Date())
            #expect(try await b.changes(ChangesSince(userId: "u1", token: token)).changes.map(\.id) == ["j0"])
        }
    }
}
