import Foundation
import GRDB
import Messages

extension HistoryDatabase {
    /// Live share links kept per item.
    public static let maxLinksPerItem = 10

    /// A new public link to the result of one of the user's completed items, valid until
    /// `expiresAt`. Nil for anyone else's item or an unknown id; `history.not_shareable` when the
    /// item has no result.
    public func shareItem(_ jobId: String, userId: String, token: String, expiresAt: Date) async throws -> ShareGrant? {
        try await write { db in
            guard let status = try String.fetchOne(db, sql: "SELECT status FROM item WHERE jobId = ? AND userId = ?", arguments: [jobId, userId]) else {
                return nil
            }
            guard status == JobStatus.completed.rawValue else {
                throw BusError(History.ErrorCode.notShareable, "only a completed edit has a result to share; this one is \(status)")
            }
            try db.execute(
                sql: "INSERT INTO share (token, jobId, userId, expiresAt) VALUES (?, ?, ?, ?)",
                arguments: [token, jobId, userId, expiresAt.milliseconds]
            )
            // At most `maxLinksPerItem` live links an item: a new one past that revokes the oldest.
            try db.execute(
                sql: """
                    DELETE FROM share WHERE jobId = ? AND token NOT IN
                        (SELECT token FROM share WHERE jobId = ? ORDER BY expiresAt DESC LIMIT ?)
                    """,
                arguments: [jobId, jobId, Self.maxLinksPerItem]
            )
            return ShareGrant(token: token, expiresAt: expiresAt)
        }
    }

    /// Revokes every link of one of the user's items; false for anyone else's item or an unknown id.
    public func revokeShares(_ jobId: String, userId: String) async throws -> Bool {
        try await write { db in
            guard try Int.fetchOne(db, sql: "SELECT 1 FROM item WHERE jobId = ? AND userId = ?", arguments: [jobId, userId]) != nil else {
                return false
            }
            try db.execute(sql: "DELETE FROM share WHERE jobId = ?", arguments: [jobId])
            return true
        }
    }
}
