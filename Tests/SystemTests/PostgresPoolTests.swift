import Bus
import Foundation
import Logging
import Messages
import Storage
import Testing

@Suite("PostgreSQL pool")
struct PostgresPoolTests {
    @Test func aServerThatCannotBeReachedFailsCallsFastAsUnavailable() async throws {
        // Given a pool of a server that does not answer (nothing listens on the port)
        let logger = { var logger = Logger(label: "test.pool"); logger.logLevel = .critical; return logger }()
        let location = try PostgresLocation(url: "postgres://photoedit:secret-password@127.0.0.1:\(freePort())/photoedit")
        try await PostgresPool(location: location, logger: logger).running { pool in
            // When a call is made, it fails within the wait for a connection, as unavailable
            let clock = ContinuousClock()
            var thrown: (any Error)?
            let first = await clock.measure {
                do { _ = try await pool.connection { db in try await db.query("SELECT 1", logger: logger) } } catch { thrown = error }
            }
            let error = try #require(thrown)
            #expect(error is PostgresUnavailable)
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
        }
    }
}
