import PostgresNIO
import TestSupport

/// Steps of the tests that hold a function of the jobs store, planned once per connection while
/// its tables were small, to probing them by key once they have grown.
enum KeptPlanSteps {
    /// Keeps `tables`' statistics as they are now: analysed, and autovacuum off for them (an
    /// ANALYZE of the grown tables would have the functions planned again, and the tests pass
    /// without their fix).
    static func keepStatistics(_ db: PostgresConnection, of tables: [String]) async throws {
        for table in tables {
            try await db.query(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) SET (autovacuum_enabled = false)"), logger: quietLogger)
            try await db.query(PostgresQuery(unsafeSQL: "ANALYZE \(table)"), logger: quietLogger)
        }
    }

    /// Grows the jobs table by 3,000 of alice's jobs, `job-00001` to `job-03000`, in `status`
    /// after `attempts` attempts.
    static func addJobs(_ db: PostgresConnection, status: String, attempts: Int) async throws {
        try await db.query("""
            INSERT INTO jobs_job (id, user_id, is_pro, image_key, effect_id, parameters, status, progress, attempts, max_attempts,
                                  created_at, updated_at, version)
            SELECT 'job-' || lpad(g::text, 5, '0'), 'alice', false, 'uploads/alice/' || g || '.jpg', 'copy', '{}', \(status), 0, \(attempts), 3,
                   1790000000 + g, 1790000000 + g, \(attempts + 1)
            FROM generate_series(1, 3000) AS g
            """, logger: quietLogger)
    }
}
