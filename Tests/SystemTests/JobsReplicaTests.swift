import Bus
import Foundation
import JobsService
import Messages
import PostgresNIO
import ServiceKit
import Storage
import Testing
import TestSupport

/// Jobs on PostgreSQL (`JOBS_DATABASE_URL`), as replicas: two real jobs processes over the test
/// PostgreSQL (`scripts/with-postgres.sh`), one worker given both worker endpoints, called over
/// the bus as the gateway calls them.
@Suite("Jobs replicas on PostgreSQL", .timeLimit(.minutes(5)))
struct JobsReplicaTests {
    struct Replica {
        var process: ServiceProcess
        var endpoint: String
    }

    /// Who holds the dispatcher's lease, and under which term.
    static func lease(_ database: PostgresPool) async throws -> (holder: String, term: Int64)? {
        try await database.connection { db in
            try await db.firstRow("SELECT holder, term FROM jobs_leader WHERE name = 'dispatcher'", as: (String, Int64).self, logger: database.logger)
        }
    }

    /// Two jobs replicas on the database at `location`, with the no-op effect, and a worker that
    /// lists both.
    static func start(on location: PostgresLocation) throws -> (replicas: [Replica], worker: ServiceProcess) {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("jobs-replicas-\(UUID().uuidString)")
        let effects = #"[{"id": "noop", "title": "No-op", "processor": "noop"}]"#
        let workerEndpoints = (0..<2).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let replicas = try workerEndpoints.map { workerEndpoint in
            let endpoint = "tcp://127.0.0.1:\(freePort())"
            let process = try ServiceProcess("jobs", environment: [
                "JOBS_BIND": endpoint, "JOBS_WORKER_BIND": workerEndpoint, "DATA_DIR": data.path, "JOBS_DATABASE_URL": TestPostgres.url(location),
                "QUOTA_ENDPOINT": "tcp://127.0.0.1:\(freePort())", "HISTORY_ENDPOINT": "tcp://127.0.0.1:\(freePort())", "JOBS_EFFECTS": effects,
            ])
            return Replica(process: process, endpoint: endpoint)
        }
        let worker = try ServiceProcess("worker", environment: [
            "JOBS_WORKER_ENDPOINT": workerEndpoints.joined(separator: ","), "WORKER_CAPACITY": "4", "WORKER_ID": "replica-worker",
            "WORKER_SCRATCH_DIR": data.appendingPathComponent("scratch").path, "JOBS_EFFECTS": effects,
        ])
        return (replicas, worker)
    }

    @Test func anyReplicaCreatesOneDispatchesAndTheOtherTakesOverWhenTheLeaderIsKilled() async throws {
        // Given two jobs replicas on one new database, and a worker that lists both
        let location = try await TestPostgres.freshDatabase()
        let (replicas, worker) = try Self.start(on: location)
        let both = replicas.map(\.endpoint).joined(separator: ",")
        try await TestPostgres.withDatabase(location) { database in
            try await withBusClients(
                replicas.map { .init(endpoint: $0.endpoint, defaultTimeout: .seconds(10)) } + [.init(endpoint: both, defaultTimeout: .seconds(10))]
            ) { clients in
                for client in clients.prefix(2) { _ = try await waitUntilHealthy(client) }
                let spread = clients[2]
                let user = "device:\(UUID().uuidString.lowercased())"
                func create(_ count: Int, through client: BusClient) async throws -> [String] {
                    let ids = (0..<count).map { _ in UUID().uuidString.lowercased() }
                    for id in ids {
                        _ = try await client.call(Jobs.create, CreateJob(jobId: id, userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: "noop"))
                    }
                    return ids
                }
                func completed(_ ids: [String]) async throws -> Bool {
                    for id in ids where try await spread.call(Jobs.get, JobReference(jobId: id, userId: user)).status != .completed { return false }
                    return true
                }
                // When jobs are created through each replica
                let first = try await create(10, through: clients[0]) + (try await create(10, through: clients[1]))
                // Then the one leader dispatches all of them to the worker
                try await waitUntil(within: .seconds(30)) { try await completed(first) }
                let leader = try #require(try await Self.lease(database))
                let leaderIndex = try #require(replicas.firstIndex { $0.process.output.contains(leader.holder) })
                let survivor = replicas[1 - leaderIndex]
                // When the leader is killed outright while jobs are being created through the list
                // (each create at either replica, sent again to the other if its replica dies) and
                // dispatched
                let creating = Task { try await create(100, through: spread) }
                try await Task.sleep(for: .milliseconds(100))
                replicas[leaderIndex].process.signal(SIGKILL)
                _ = try await replicas[leaderIndex].process.waitForExit()
                let killed = ContinuousClock.now
                // Then the other holds the lease, under a higher term, once the leader's has expired
                // (a second after its last renewal). How long that took is said, not bounded: a
                // busy machine may take longer, and `make hosts-chaos` reports how soon a crashed
                // leader's work goes on.
                var next = try await Self.lease(database)
                while next?.holder == leader.holder, ContinuousClock.now - killed < .seconds(60) {
                    try await Task.sleep(for: .milliseconds(20))
                    next = try await Self.lease(database)
                }
                print("jobs replicas: the survivor held the lease \(ContinuousClock.now - killed) after the leader was killed")
                #expect(next.map { $0.holder != leader.holder && $0.term > leader.term } == true, "\(String(describing: next))")
                // The survivor names itself the holder in its log (written as it takes the lease,
                // read here once the process has flushed it)
                if let holder = next?.holder {
                    try await waitUntil(within: .seconds(10)) { survivor.process.output.contains(holder) }
                }
                // And every job created, before and during the kill, completes, dispatched by the
                // survivor to the same worker
                let second = try await creating.value
                try await waitUntil(within: .seconds(30)) { try await completed(second) }
                // And no job ran to completion twice: each has exactly one settlement (a commit),
                // whatever attempt finished it
                let settlements = try await database.connection { db in
                    try await db.allRows(
                        "SELECT kind, count(*) FROM jobs_outbox WHERE topic = 'quota' GROUP BY kind", as: (String, Int).self, logger: database.logger
                    )
                }
                #expect(settlements.map(\.0) == ["commit"] && settlements.first?.1 == first.count + second.count)
                let twice = try await database.connection { db in
                    try await db.first(
                        "SELECT count(*) FROM (SELECT job_id FROM jobs_outbox WHERE topic = 'quota' GROUP BY job_id HAVING count(*) > 1) AS settled_twice",
                        as: Int.self, logger: database.logger
                    )
                }
                #expect(twice == 0)
            }
        }
        await worker.stop()
        for replica in replicas { await replica.process.stop() }
    }

    @Test func anOperatorsPauseMadeThroughEitherReplicaReachesTheLeaderAndLosesNoJob() async throws {
        let location = try await TestPostgres.freshDatabase()
        let (replicas, worker) = try Self.start(on: location)
        try await TestPostgres.withDatabase(location) { _ in
            try await withBusClients(replicas.map { .init(endpoint: $0.endpoint, defaultTimeout: .seconds(10)) }) { clients in
                for client in clients { _ = try await waitUntilHealthy(client) }
                let user = "device:\(UUID().uuidString.lowercased())"
                // The leader is the replica whose overview has the worker
                var leaderIndex: Int?
                try await waitUntil(within: .seconds(30)) {
                    for (index, client) in clients.enumerated() where try await client.call(Admin.overview, Empty()).workers.count == 1 { leaderIndex = index }
                    return leaderIndex != nil
                }
                let leader = clients[leaderIndex!], follower = clients[1 - leaderIndex!]
                #expect(try await follower.call(Admin.overview, Empty()).dispatching == false)
                // A pause made through the follower is stored, and reaches the leader
                _ = try await follower.call(Admin.control, AdminControl(change: .pauseEffect("noop"), actor: "admin"))
                try await waitUntil(within: .seconds(30)) { try await leader.call(Admin.overview, Empty()).controls.pausedEffects == ["noop"] }
                let ids = (0..<3).map { _ in UUID().uuidString.lowercased() }
                for id in ids {
                    _ = try await follower.call(Jobs.create, CreateJob(jobId: id, userId: user, isPro: false, imageKey: "uploads/none/x.jpg", effectId: "noop"))
                }
                // The leader knows the three and hands none out
                try await waitUntil(within: .seconds(30)) {
                    let noop = try await leader.call(Admin.overview, Empty()).effects.first { $0.effect == "noop" }
                    return noop?.queued == 3 && noop?.paused == true
                }
                #expect(try await leader.call(Admin.overview, Empty()).workers.first?.running == 0)
                // Resumed through the follower: all three complete
                _ = try await follower.call(Admin.control, AdminControl(change: .resumeEffect("noop"), actor: "admin"))
                try await waitUntil(within: .seconds(30)) {
                    for id in ids where try await leader.call(Jobs.get, JobReference(jobId: id, userId: user)).status != .completed { return false }
                    return true
                }
                let audit = try await leader.call(Admin.auditLog, AuditQuery())
                #expect(audit.entries.map(\.action) == ["dispatch.resume", "dispatch.pause"])
            }
        }
        await worker.stop()
        for replica in replicas { await replica.process.stop() }
    }
}
