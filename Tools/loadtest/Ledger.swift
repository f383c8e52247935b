import Foundation
import Synchronization

/// What the virtual users did that the invariants check afterwards: each user, its plan, the jobs
/// it saw accepted (with when), the final states it saw, and the jobs it deleted.
final class Ledger: Sendable {
    struct User: Sendable {
        var credentials: Credentials
        var profile: String
        var plan: String
        /// Job id to the time its creation was answered 202 (a retried creation answers the same id).
        var accepted: [String: Date] = [:]
        /// Job id to the last state seen.
        var states: [String: String] = [:]
        var deleted: Set<String> = []
        /// Jobs whose delete got no answer, or a 502, 503 or 504, after every try: deleted or not.
        var mayBeDeleted: Set<String> = []

        /// Jobs it deleted, or may have: the checks that need the job skip them.
        func gone(_ job: String) -> Bool { deleted.contains(job) || mayBeDeleted.contains(job) }
    }

    private let users = Mutex<[String: User]>([:])
    static let maxUsers = 100_000

    /// Registers a user; false when the ledger is full (the session does not run).
    func register(_ credentials: Credentials, profile: String, plan: String) -> Bool {
        users.withLock { users in
            guard users.count < Self.maxUsers else { return false }
            users[credentials.userId] = User(credentials: credentials, profile: profile, plan: plan)
            return true
        }
    }

    /// Records a 202; true if the job is new to this user.
    @discardableResult
    func accepted(_ jobId: String, user: String, at date: Date = Date()) -> Bool {
        users.withLock { users in
            guard users[user]?.accepted[jobId] == nil else { return false }
            users[user]?.accepted[jobId] = date
            users[user]?.states[jobId] = "queued"
            return true
        }
    }

    func saw(_ state: String, job: String, user: String) { users.withLock { $0[user]?.states[job] = state } }
    func deleted(_ job: String, user: String) { users.withLock { _ = $0[user]?.deleted.insert(job) } }
    func mayHaveDeleted(_ job: String, user: String) { users.withLock { _ = $0[user]?.mayBeDeleted.insert(job) } }

    var all: [User] { users.withLock { Array($0.values) }.sorted { $0.credentials.userId < $1.credentials.userId } }
}
