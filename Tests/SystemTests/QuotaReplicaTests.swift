import Bus
import Foundation
import Messages
import PostgresNIO
import QuotaService
import ServiceKit
import Storage
import Testing
import TestSupport

/// Quota on PostgreSQL (`QUOTA_DATABASE_URL`), as replicas: real quota processes over the test
/// PostgreSQL (`scripts/with-postgres.sh`), called over the bus.
@Suite("Quota replicas on PostgreSQL", .timeLimit(.minutes(5)))
struct QuotaReplicaTests {
    /// Starts `count` quota processes on one fresh database, at once (so that they migrate
    /// together), each on its own endpoint.
    static func replicas(_ count: Int, location: PostgresLocation) throws -> [(process: ServiceProcess, endpoint: String)] {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("quota-replicas-\(UUID().uuidString)")
        return try (0..<count).map { _ in
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            let process = try ServiceProcess("quota", environment: [
                "QUOTA_BIND": endpoint, "DATA_DIR": data.path, "QUOTA_DATABASE_URL": TestPostgres.url(location),
                "JOBS_ENDPOINT": "tcp://127.0.0.1:\(freePort())",
            ])
            return (process, endpoint)
        }
    }

    @Test func twoReplicasAdmitExactlyTheCreditsLeftWhicheverTheyReachAndAnswerDurably() async throws {
        // Given two quota replicas started together on one new database
        let location = try await TestPostgres.freshDatabase()
        let replicas = try Self.replicas(2, location: location)
        // 200 decisions of one user run one at a time (its lock): a loaded machine needs a while.
        try await withBusClients(replicas.map { .init(endpoint: $0.endpoint, defaultTimeout: .seconds(60)) }) { clients in
            for client in clients { _ = try await waitUntilHealthy(client) }
            // They migrated once between them
            let applied = try await TestPostgres.withDatabase(location) { database in
                try await database.client.withConnection { db in
                    try await db.first("SELECT count(*) FROM schema_migration WHERE service = 'quota'", as: Int.self, logger: database.logger)
                }
            }
            #expect(applied == PostgresQuotaStore.migrations.count)
            // When 200 creates of one free user arrive at once, spread over both
            let outcomes = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<200 {
                    let client = clients[index % 2]
                    group.addTask { try await client.call(Quota.reserve, ReserveQuota(userId: "device:replicas", jobId: "r-\(index)")).admitted }
                }
                return try await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            // Then exactly 20 are admitted, and both replicas see the same windows
            #expect(outcomes.filter { $0 }.count == 20)
            for client in clients {
                #expect(try await client.call(Quota.status, UserReference(userId: "device:replicas")).daily.used == 20)
            }
            // And when one replica is killed outright, the other answers for every admission,
            // and a re-sent admitted job id (a retry through the other) charges nothing more
            replicas[0].process.signal(SIGKILL)
            _ = try await replicas[0].process.waitForExit()
            let usage = try await clients[1].call(Quota.usage, UserReference(userId: "device:replicas"))
            #expect(usage.charges.count == 20)
            let admitted = try #require(usage.charges.first?.jobId)
            #expect(try await clients[1].call(Quota.reserve, ReserveQuota(userId: "device:replicas", jobId: admitted)).admitted)
            #expect(try await clients[1].call(Quota.status, UserReference(userId: "device:replicas")).daily.used == 20)
            // And another user cannot take an admitted job id, whichever replica they reach
            do throws(BusError) {
                _ = try await clients[1].call(Quota.reserve, ReserveQuota(userId: "device:other", jobId: admitted))
                Issue.record("a job id was charged to two users")
            } catch {
                #expect(error.code == Quota.ErrorCode.jobIdTaken)
            }
        }
        for replica in replicas { await replica.process.stop() }
    }

    @Test func aReplicaThatCannotReachItsDatabaseStopsSayingWhy() async throws {
        // Given a URL whose server does not answer and one that is not a URL at all
        let nowhere = try ServiceProcess("quota", environment: [
            "QUOTA_BIND": "tcp://127.0.0.1:\(freePort())", "DATA_DIR": FileManager.default.temporaryDirectory.path,
            "QUOTA_DATABASE_URL": "postgres://quota:secret-password@127.0.0.1:\(freePort())/quota",
        ])
        let malformed = try ServiceProcess("quota", environment: [
            "QUOTA_BIND": "tcp://127.0.0.1:\(freePort())", "DATA_DIR": FileManager.default.temporaryDirectory.path,
            "QUOTA_DATABASE_URL": "mysql://secret-password",
        ])
        // Then each exits non-zero, naming what, and never the password
        for process in [nowhere, malformed] {
            let status = try await process.waitForExit(within: .seconds(60))
            #expect(status != nil && status != 0)
            #expect(!process.output.contains("secret-password"), "\(process.output)")
        }
        #expect(malformed.output.contains("QUOTA_DATABASE_URL"))
        await nowhere.stop()
        await malformed.stop()
    }
}
