import Foundation
import Messages
import PostgresNIO
import Storage

/// The devices that hear of a user's jobs by push, on PostgreSQL (any replica writes them).
extension PostgresJobsStore {
    /// Registers `device` (a token another user had moves to this one); past
    /// `Devices.maxPerUser`, the user's device registered longest ago is forgotten.
    public func putDevice(_ device: DeviceRegistration, now: Date) async throws -> DeviceRecord {
        try await write { store, db in
            let stamp = now.timeIntervalSince1970
            try await db.query("""
                INSERT INTO jobs_device (token, user_id, platform, environment, registered_at)
                VALUES (\(device.token), \(device.userId), \(device.platform.rawValue), \(device.environment.rawValue), \(stamp))
                ON CONFLICT (token) DO UPDATE SET user_id = excluded.user_id, platform = excluded.platform,
                    environment = excluded.environment, registered_at = excluded.registered_at
                """, logger: store.logger)
            try await db.query("""
                DELETE FROM jobs_device WHERE user_id = \(device.userId) AND token NOT IN
                    (SELECT token FROM jobs_device WHERE user_id = \(device.userId) ORDER BY registered_at DESC, token LIMIT \(Devices.maxPerUser))
                """, logger: store.logger)
            return DeviceRecord(token: device.token, platform: device.platform, environment: device.environment, registeredAt: now)
        }
    }

    /// Removes the user's `token`; false when the user has no such device.
    public func deleteDevice(userId: String, token: String) async throws -> Bool {
        try await write { store, db in
            try await db.first("DELETE FROM jobs_device WHERE token = \(token) AND user_id = \(userId) RETURNING 1", as: Int.self, logger: store.logger) != nil
        }
    }

    /// Forgets `token` whoever has it: its push service said it is no longer registered.
    public func forgetDevice(token: String) async throws {
        _ = try await write { store, db in try await db.query("DELETE FROM jobs_device WHERE token = \(token)", logger: store.logger) }
    }

    /// The push notifications of the jobs in `ended` that completed or failed, one per device of
    /// their users on a platform push is configured for, in one statement of the transaction that
    /// ended them.
    func notify(_ db: PostgresConnection, _ ended: [JobRecord]) async throws {
        let jobs = ended.filter { $0.status == .completed || $0.status == .failed }
        guard !pushPlatforms.isEmpty, !jobs.isEmpty else { return }
        try await db.query("""
            INSERT INTO jobs_outbox (topic, kind, job_id, version, payload, created_at, next_attempt_at)
            SELECT \(OutboxEntry.Topic.push), d.platform, e.job_id, e.version,
                convert_to(json_build_object('userId', d.user_id, 'token', d.token, 'platform', d.platform, 'environment', d.environment,
                                             'jobId', e.job_id, 'status', e.status)::text, 'UTF8'),
                e.at, e.at
            FROM unnest(\(jobs.map(\.id))::text[], \(jobs.map(\.userId))::text[], \(jobs.map(\.status.rawValue))::text[],
                        \(jobs.map(\.version))::bigint[], \(jobs.map(\.updatedAt.timeIntervalSince1970))::float8[])
                AS e(job_id, user_id, status, version, at)
            JOIN jobs_device d ON d.user_id = e.user_id
            WHERE d.platform = ANY(\(pushPlatforms.map(\.rawValue))::text[])
            """, logger: logger)
    }
}
