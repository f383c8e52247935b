import Foundation
import Messages

/// What the quota service stores, as the operations its bus methods and background work need:
/// each one transaction, a write durable before it returns. `QuotaHandler` and
/// `StaleReservationResolver` depend on this and nothing else; `QuotaDatabase` (SQLite, group
/// committed) is today's implementation.
public protocol QuotaStore: Sendable {
    /// Charges the job's price in every window at once, or denies naming the windows that refuse;
    /// a job id already charged answers its first admission again.
    func reserve(_ request: ReserveQuota, now: Date) async throws -> QuotaDecision
    /// The job completed: its charge stays. Idempotent; a released charge is refused.
    func commit(jobId: String, now: Date) async throws -> Charge
    /// The job did not complete: its charge goes back to the windows it was taken from.
    /// Idempotent; a committed charge is refused.
    func release(jobId: String, now: Date) async throws -> Charge
    /// A user's plan and windows now.
    func status(userId: String, now: Date) async throws -> QuotaStatus
    /// Grants credits (or takes them back) in the user's current windows, once per adjustment id.
    func adjust(_ request: AdjustCredits, now: Date) async throws -> CreditsAdjusted
    /// Sets a user's plan (and time zone, and end).
    func setPlan(_ request: SetPlan, now: Date) async throws -> QuotaStatus
    /// Applies a subscription event once per event id, in order per user.
    func applySubscription(_ event: SubscriptionEvent, now: Date) async throws -> SubscriptionOutcome
    /// Admits a guest id (a new one within its network's limit).
    func admitGuest(_ request: AdmitGuest, now: Date) async throws -> GuestAdmission
    /// Binds an attested App Attest key to a guest id.
    func attestGuest(_ request: AttestGuest, now: Date) async throws -> GuestAttestation
    /// A user's windows and their latest charges.
    func usage(userId: String, now: Date) async throws -> UserUsage
    /// Reservations neither committed nor released, made before `cutoff`, oldest first.
    func staleReservations(before cutoff: Date, limit: Int) async throws -> [StaleReservation]
    /// Deletes up to `limit` charges settled before `cutoff` (the idempotency window's start),
    /// oldest first, and answers how many: their job ids are forgotten. Reservations are kept
    /// whatever their age (the stale-reservation resolver settles them).
    func forget(settledBefore cutoff: Date, limit: Int) async throws -> Int
}

/// A reservation neither committed nor released: its job id, and when it was made.
public struct StaleReservation: Sendable, Equatable {
    public var jobId: String
    public var reservedAt: Date

    public init(jobId: String, reservedAt: Date) {
        self.jobId = jobId
        self.reservedAt = reservedAt
    }
}
