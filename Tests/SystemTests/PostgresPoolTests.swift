import Bus
import Foundation
import Logging
import Messages
import PostgresNIO
import Storage
import Testing
import TestSupport

@Suite("PostgreSQL pool")
struct PostgresPoolTests {
    let logger = { var logger = Logger(label: "test.pool"); logger.logLevel = .critical; return logger }()

    @Test func aServerThatCannotBeReachedFailsCallsFastAsUnavailable() async throws {
        // Given a pool of a server that does not answer (nothing listens on the port)
        let location = try PostgresLocation(url: "postgres://photoedit:secret-password@127.0.0.1:\(freePort())/photoedit")
        let clock = ContinuousClock()
        let logger = logger
        let whole = try await clock.measure {
            try await PostgresPool(location: location, logger: logger).running { pool in
                // When a call is made, it fails within the wait for a connection, as unavailable
                var thrown: (any Error)?
                let first = await clock.measure {
                    do { _ = try await pool.connection { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
                }
                let error = try #require(thrown)
                #expect(error is PostgresUnavailable, "\(error)")
                #expect(first < PostgresPool.acquireLimit + .seconds(2))
                #expect(StorageFailure.busError(for: error)?.code == .unavailable)
                #expect(!"\(error)".contains("secret-password"))
                // And the calls right after fail at once, without waiting again
                thrown = nil
                let second = await clock.measure {
                    do { _ = try await pool.transaction { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
                }
                #expect(thrown is PostgresUnavailable)
                #expect(second < PostgresPool.acquireLimit)
                // And once a probe interval has passed, a caller tries the server again (and waits for it)
                var probe = Duration.zero
                try await waitUntil(within: .seconds(10)) {
                    probe = await clock.measure { _ = try? await pool.connection { db in try await db.query("SELECT 1", logger: logger) } }
                    return probe >= PostgresPool.acquireLimit
                }
            }
        }
        // Then the abandoned waits, still in the pool's queue, do not hold its stop (a bound, not a speed)
        #expect(whole < .seconds(30))
    }

    @Test func anOperationPastItsLimitIsAbandonedAndTheNextOneRuns() async throws {
        // Given a pool of a real server, and one connection only
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
            // When an operation outlasts its limit
            var thrown: (any Error)?
            do {
                _ = try await pool.connection(limit: .milliseconds(1500)) { db in try await db.query("SELECT pg_sleep(30)", logger: logger) }
            } catch {
                thrown = error
            }
            // Then its caller hears it timed out (outcome unknown: storage_unavailable)
            let error = try #require(thrown)
            #expect(error is PostgresOperationTimedOut, "\(error)")
            #expect(StorageFailure.busError(for: error)?.code == .storageUnavailable)
            // And its connection was closed, so the only connection of the pool serves the next call
            let answer = try await pool.transaction { db in try await db.first("SELECT 42", as: Int.self, logger: logger) }
            #expect(answer == 42)
        }
    }

    @Test func aBodyStartsOnlyIfItsCallerStillWaits() async throws {
        // Given a pool of one connection, held by a long operation
        let location = try await TestPostgres.freshDatabase()
        let logger = logger
        try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
            try await pool.connection { db in _ = try await db.query("CREATE TABLE ran (n int)", logger: logger) }
            async let holder: Void = {
                _ = try? await pool.connection(limit: .seconds(10)) { db in try await db.query("SELECT pg_sleep(2)", logger: logger) }
            }()
            try await TestPostgres.withDatabase(location) { watcher in
                try await waitUntil(within: .seconds(10)) {
                    try await watcher.connection { db in
                        try await db.first(
                            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(2)'", as: Int.self, logger: logger
                        )
                    } == 1
                }
            }
            // When another caller gives up waiting for the connection
            var thrown: (any Error)?
            do {
                _ = try await pool.connection { db in try await db.query("INSERT INTO ran VALUES (1)", logger: logger) }
            } catch {
                thrown = error
            }
            #expect(thrown is PostgresUnavailable, "\(String(describing: thrown))")
            await holder
            // Then its body never runs, even once the connection is free: the wait stayed queued,
            // and the pool's queue is first come, first served, so the count below runs after it
            var rows: Int?
            try await waitUntil(within: .seconds(10)) {
                rows = try? await pool.connection { db in try await db.first("SELECT count(*) FROM ran", as: Int.self, logger: logger) }
                return rows != nil
            }
            #expect(rows == 0)
        }
    }
}
