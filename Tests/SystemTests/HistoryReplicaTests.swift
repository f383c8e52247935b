import Bus
import Foundation
import HistoryService
import Messages
import ServiceKit
import Storage
import Testing
import TestSupport

/// History on PostgreSQL (`HISTORY_DATABASE_URL`), as replicas: real history processes over the
/// test PostgreSQL (`scripts/with-postgres.sh`), called over the bus as jobs and the gateway call
/// them, with one endpoint setting listing both.
@Suite("History replicas on PostgreSQL", .timeLimit(.minutes(5)))
struct HistoryReplicaTests {
    @Test func eventsAndReadsReachEitherReplicaAndTheOtherServesAloneAfterAKill() async throws {
        // Given two history replicas started together on one new database
        let location = try await TestPostgres.freshDatabase()
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("history-replicas-\(UUID().uuidString)")
        let replicas = try (0..<2).map { _ in
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            let process = try ServiceProcess("history", environment: [
                "HISTORY_BIND": endpoint, "DATA_DIR": data.path, "HISTORY_DATABASE_URL": TestPostgres.url(location),
                "JOBS_ENDPOINT": "tcp://127.0.0.1:\(freePort())", "QUOTA_ENDPOINT": "tcp://127.0.0.1:\(freePort())",
            ])
            return (process: process, endpoint: endpoint)
        }
        let both = replicas.map(\.endpoint).joined(separator: ",")
        try await withBusClients(
            replicas.map { .init(endpoint: $0.endpoint, defaultTimeout: .seconds(10)) } + [.init(endpoint: both, defaultTimeout: .seconds(10))]
        ) { clients in
            let (first, second, spread) = (clients[0], clients[1], clients[2])
            for client in [first, second] { _ = try await waitUntilHealthy(client) }
            // When jobs' events arrive through the list (each batch at either replica), twice over
            let events = (0..<60).map { index in
                JobEvent(
                    job: JobRecord(
                        id: "job-\(index)", userId: "replica-user", isPro: false, imageKey: "uploads/replica-user/a.jpg", effectId: "blur",
                        parameters: [:], prompt: index % 2 == 0 ? "a golden sunset" : "city at night", status: .completed, progress: 1,
                        attempts: 1, maxAttempts: 3, lastError: nil, resultKey: "results/job-\(index)/1.jpg", thumbnailKey: nil,
                        createdAt: Date(timeIntervalSince1970: 1_764_000_000 + Double(index)), updatedAt: Date(), startedAt: nil, finishedAt: nil,
                        version: 2
                    ),
                    effectTitle: "Soft Focus"
                )
            }
            var applied = 0
            for round in 0..<2 {
                for batch in stride(from: 0, to: events.count, by: 10) {
                    let outcome = try await spread.call(History.apply, JobEvents(events: Array(events[batch..<batch + 10])))
                    if round == 0 { applied += outcome.applied } else { #expect(outcome.applied == 0) }
                }
            }
            #expect(applied == 60)
            // Then each replica lists the same page, searches by substring, and opens the other's cursor
            let page = try await first.call(History.list, ListHistory(userId: "replica-user", limit: 25, query: "unset"))
            #expect(page.totalCount == 30)
            let next = try await second.call(History.list, ListHistory(userId: "replica-user", limit: 25, cursor: page.nextCursor, query: "unset"))
            #expect(next.items.count == 5)
            #expect(Set(page.items.map(\.jobId)).isDisjoint(with: next.items.map(\.jobId)))
            // And when one replica is killed outright, calls through the list reach the other
            replicas[0].process.signal(SIGKILL)
            _ = try await replicas[0].process.waitForExit()
            // (a delete is retry-safe: one routed to the dead replica is sent again to the other,
            // and a delete sent twice gets the same answer)
            for _ in 0..<2 {
                #expect(try await spread.call(History.delete, HistoryItemReference(userId: "replica-user", jobId: "job-0")).jobId == "job-0")
            }
            for _ in 0..<10 {
                #expect(try await spread.call(History.list, ListHistory(userId: "replica-user", limit: 1)).totalCount == 59)
            }
            // And another user's id answers not found there too
            await #expect(throws: BusError.self) {
                _ = try await spread.call(History.get, HistoryItemReference(userId: "someone-else", jobId: "job-1"))
            }
        }
        for replica in replicas { await replica.process.stop() }
    }
}
