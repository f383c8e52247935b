import Foundation
import GRDB
import Messages

/// A user's plan, until when it holds, and time zone (users without a row are on the default
/// plan, in UTC), with the time of the last subscription event applied to them.
struct UserRecord: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "user"
    var id: String
    var plan: String
    var timeZone: String?
    var updatedAt: Date
    var planEndsAt: Date?
    var subscriptionEventAt: Date?
}

extension Charge: FetchableRecord, PersistableRecord {
    public static var databaseTableName: String { "charge" }

    public enum Columns {
        public static let jobId = Column("jobId")
        public static let userId = Column("userId")
        public static let reservedAt = Column("reservedAt")
    }
}
