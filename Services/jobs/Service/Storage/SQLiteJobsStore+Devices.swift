import Foundation
import GRDB
import Messages
import Storage

/// The devices that hear of a user's jobs by push, on SQLite.
extension SQLiteJobsStore {
    /// Registers `device` (a token another user had moves to this one); past
    /// `Devices.maxPerUser`, the user's device registered longest ago is forgotten.
    public func putDevice(_ device: DeviceRegistration, now: Date) async throws -> DeviceRecord {
        try await database.write { db in
            try db.execute(sql: """
                INSERT INTO device (token, userId, platform, environment, registeredAt) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (token) DO UPDATE SET userId = excluded.userId, platform = excluded.platform,
                    environment = excluded.environment, registeredAt = excluded.registeredAt
                """, arguments: [device.token, device.userId, device.platform.rawValue, device.environment.rawValue, StoredDate.text(now)])
            try db.execute(sql: """
                DELETE FROM device WHERE userId = ? AND token NOT IN
                    (SELECT token FROM device WHERE userId = ? ORDER BY registeredAt DESC, token LIMIT ?)
                """, arguments: [device.userId, device.userId, Devices.maxPerUser])
            return DeviceRecord(token: device.token, platform: device.platform, environment: device.environment, registeredAt: now)
        }
    }

    /// Removes the user's `token`; false when the user has no such device.
    public func deleteDevice(userId: String, token: String) async throws -> Bool {
        try await database.write { db in
            try db.execute(sql: "DELETE FROM device WHERE token = ? AND userId = ?", arguments: [token, userId])
            return db.changesCount > 0
        }
    }

    /// Forgets `token` whoever has it: its push service said it is no longer registered.
    public func forgetDevice(token: String) async throws {
        try await database.write { db in try db.execute(sql: "DELETE FROM device WHERE token = ?", arguments: [token]) }
    }

    /// The push notifications of a job that completed or failed, one per device of its user on
    /// a platform push is configured for, written to the outbox in the transaction that ended it.
    func notify(_ db: Database, _ job: JobRecord) throws {
        guard !pushPlatforms.isEmpty, job.status == .completed || job.status == .failed else { return }
        let platforms = pushPlatforms.map { _ in "?" }.joined(separator: ", ")
        let stamp = StoredDate.text(job.updatedAt)
        try db.cachedStatement(sql: """
            INSERT INTO outbox (topic, kind, jobId, version, payload, createdAt, attempts, nextAttemptAt)
            SELECT '\(OutboxEntry.Topic.push)', platform, ?, ?,
                CAST(json_object('userId', userId, 'token', token, 'platform', platform, 'environment', environment, 'jobId', ?, 'status', ?) AS BLOB),
                ?, 0, ?
            FROM device WHERE userId = ? AND platform IN (\(platforms))
            """).execute(arguments: StatementArguments([job.id, job.version, job.id, job.status.rawValue, stamp, stamp, job.userId] as [any DatabaseValueConvertible])
                + StatementArguments(pushPlatforms.map(\.rawValue)))
    }
}
