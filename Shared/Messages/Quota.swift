import BinaryWire
import Foundation

/// The quota service's methods: plans, usage windows and the charges made against them.
public enum Quota {
    /// Reserves `cost` units for a job against the user's daily and monthly windows, atomically.
    /// Reserving the same job id again returns the first admission and charges nothing more.
    /// Jobs reserves too, for an operator's retry of a failed job.
    public static let reserve = BusMethod<ReserveQuota, QuotaDecision>("quota.reserve", roles: [.gateway, .jobs], retrySafe: true)
    /// Confirms a reservation: the job completed. Idempotent.
    public static let commit = BusMethod<ChargeReference, Charge>("quota.commit", roles: [.jobs, .operator], retrySafe: true)
    /// Gives a reservation's units back to the windows they were charged in. Idempotent.
    public static let release = BusMethod<ChargeReference, Charge>("quota.release", roles: [.gateway, .jobs, .operator], retrySafe: true)
    /// A user's plan, usage and limits, without charging.
    public static let status = BusMethod<UserReference, QuotaStatus>("quota.status", roles: [.gateway, .history, .operator], retrySafe: true)
    /// Admin: sets a user's plan and, optionally, time zone.
    public static let setPlan = BusMethod<SetPlan, QuotaStatus>("quota.set-plan", roles: [.gateway, .operator], retrySafe: true)
    /// Admin: grants a user credits in their current day and month windows (a negative amount
    /// takes them back), with `used` moved by exactly that much in both (below zero if need be).
    /// Applied once per adjustment id; kept among the user's charges as `grant:` and the id, its
    /// cost the negated amount.
    public static let adjust = BusMethod<AdjustCredits, CreditsAdjusted>("quota.adjust", roles: [.gateway, .operator], retrySafe: true)
    /// Admin: a user's usage and recent charges.
    public static let usage = BusMethod<UserReference, UserUsage>("quota.usage", roles: [.gateway, .operator], retrySafe: true)
    /// The plan catalogue: limits and history retention of each plan.
    public static let plans = BusMethod<Empty, [PlanDescription]>("quota.plans", roles: [.gateway, .history, .operator], retrySafe: true)
    /// Applies a subscription event from the app store side (a purchase, renewal, expiry or
    /// refund): once per event id, and only if it is not older than the last one applied for
    /// the user. Durable before it answers.
    public static let applySubscription = BusMethod<SubscriptionEvent, SubscriptionOutcome>("quota.apply-subscription", roles: [.gateway, .operator], retrySafe: true)
    /// Admits a guest id seen for the first time from a client network, or refuses it past the
    /// network's limit of new guests an hour. A guest id admitted before is admitted again.
    public static let admitGuest = BusMethod<AdmitGuest, GuestAdmission>("quota.admit-guest", roles: [.gateway], retrySafe: true)
    /// Binds an App Attest key (verified by the gateway) to a guest id: the guest is admitted
    /// whatever its network's count of new guests, and its jobs no longer draw on its network's
    /// shared credits. A key belongs to one guest; a guest's new key replaces its old one.
    public static let attestGuest = BusMethod<AttestGuest, GuestAttestation>("quota.attest-guest", roles: [.gateway], retrySafe: true)

    /// Error codes the quota service answers with.
    public enum ErrorCode {
        /// The plan named is not in the catalogue.
        public static let unknownPlan = BusError.Code("quota.unknown_plan")
        /// The time zone is not an IANA identifier this system knows.
        public static let unknownTimeZone = BusError.Code("quota.unknown_time_zone")
        /// The charge was released and cannot be committed (or committed and cannot be released).
        public static let chargeSettled = BusError.Code("quota.charge_settled")
        /// The job id is already charged to another user.
        public static let jobIdTaken = BusError.Code("quota.job_id_taken")
    }
}

/// Asks to charge `cost` units for `jobId` to `userId`.
@BinaryMessage
public struct ReserveQuota: Codable, Sendable, Equatable {
    public var userId: String
    public var jobId: String
    public var cost: Int
    /// For a guest, the client network it calls from (`v4:203.0.113.0/24`): the guests of one
    /// network share its free credits of the day as well.
    public var network: String?

    public init(userId: String, jobId: String, cost: Int = 1, network: String? = nil) {
        self.userId = userId
        self.jobId = jobId
        self.cost = cost
        self.network = network
    }
}

/// A guest id and the client network it calls from. With `attestedOnly`, only a guest whose
/// device was attested (App Attest) is admitted.
public struct AdmitGuest: Codable, Sendable, Equatable {
    public var userId: String
    public var network: String
    public var attestedOnly: Bool?
    public init(userId: String, network: String, attestedOnly: Bool? = nil) {
        self.userId = userId
        self.network = network
        self.attestedOnly = attestedOnly
    }
}

/// Whether a guest id may be used: admitted, or refused because its network made `limit` new
/// guests in the last hour (until `retryAt`), or, `attestationRequired`, because only attested
/// guests are admitted and this one is not.
public struct GuestAdmission: Codable, Sendable, Equatable {
    public var admitted: Bool
    public var limit: Int
    public var retryAt: Date?
    public var attestationRequired: Bool?
    public init(admitted: Bool, limit: Int, retryAt: Date?, attestationRequired: Bool? = nil) {
        self.admitted = admitted
        self.limit = limit
        self.retryAt = retryAt
        self.attestationRequired = attestationRequired
    }
}

/// A guest id, the client network it calls from, and the App Attest key id (base64) its
/// device attested.
public struct AttestGuest: Codable, Sendable, Equatable {
    public var userId: String
    public var network: String
    public var keyId: String
    public init(userId: String, network: String, keyId: String) {
        self.userId = userId
        self.network = network
        self.keyId = keyId
    }
}

/// Whether the key is now the guest's: false when it is bound to another guest.
public struct GuestAttestation: Codable, Sendable, Equatable {
    public var attested: Bool
    public init(attested: Bool) { self.attested = attested }
}

/// Grants `credits` to a user (negative: takes them back), once per `adjustmentId`.
public struct AdjustCredits: Codable, Sendable, Equatable {
    public var userId: String
    public var credits: Int
    public var adjustmentId: String
    /// The most credits one adjustment moves, either way.
    public static let maxCredits = 10_000
    /// The charge that records an adjustment.
    public var chargeId: String { "grant:" + adjustmentId }
    public init(userId: String, credits: Int, adjustmentId: String) {
        self.userId = userId
        self.credits = credits
        self.adjustmentId = adjustmentId
    }
}

/// An adjustment's outcome: whether this call applied it (false: it was applied before), and
/// the user's quota now.
public struct CreditsAdjusted: Codable, Sendable, Equatable {
    public var applied: Bool
    public var status: QuotaStatus
    public init(applied: Bool, status: QuotaStatus) {
        self.applied = applied
        self.status = status
    }
}

/// Names a charge by its job id.
public struct ChargeReference: Codable, Sendable, Equatable {
    public var jobId: String
    public init(jobId: String) { self.jobId = jobId }
}

/// Names a user.
@BinaryMessage
public struct UserReference: Codable, Sendable, Equatable {
    public var userId: String
    public init(userId: String) { self.userId = userId }
}

/// Sets a user's plan and time zone (nil keeps the current zone; "" clears it to UTC), and
/// until when the plan holds (nil: no end); past `endsAt` the user is on the default plan.
public struct SetPlan: Codable, Sendable, Equatable {
    public var userId: String
    public var plan: String
    public var timeZone: String?
    public var endsAt: Date?

    public init(userId: String, plan: String, timeZone: String? = nil, endsAt: Date? = nil) {
        self.userId = userId
        self.plan = plan
        self.timeZone = timeZone
        self.endsAt = endsAt
    }
}

/// A subscription event, as the gateway reads it from a store's webhook.
public struct SubscriptionEvent: Codable, Sendable, Equatable {
    /// Grants the plan until `endsAt` (nil: no end), or ends it (the user is on the default plan).
    public enum Effect: String, Codable, Sendable {
        case grant, revoke
    }

    /// The event's id at its source (or a hash of its body): applied once.
    public var eventId: String
    public var userId: String
    public var effect: Effect
    /// The plan a grant gives (`pro`).
    public var plan: String
    public var endsAt: Date?
    /// When the event happened at its source: events older than the last applied change nothing.
    public var occurredAt: Date
    /// The source's name for the event (`subscription_started`), kept with it.
    public var type: String

    public init(eventId: String, userId: String, effect: Effect, plan: String, endsAt: Date?, occurredAt: Date, type: String) {
        self.eventId = eventId
        self.userId = userId
        self.effect = effect
        self.plan = plan
        self.endsAt = endsAt
        self.occurredAt = occurredAt
        self.type = type
    }
}

/// What applying a subscription event did.
public struct SubscriptionOutcome: Codable, Sendable, Equatable {
    /// `applied`, `duplicate` (this event id was seen before) or `stale` (older than the last
    /// event applied for the user).
    public var result: String
    public var status: QuotaStatus

    public init(result: String, status: QuotaStatus) {
        self.result = result
        self.status = status
    }
}

/// One calendar window of a user's quota, as of a moment.
@BinaryMessage
public struct QuotaWindow: Codable, Sendable, Equatable {
    /// `daily` or `monthly`.
    public var name: String
    /// The plan's limit for the window; nil when the plan has none.
    public var limit: Int?
    /// Units charged in the window, reservations included.
    public var used: Int
    /// Units left; nil when there is no limit.
    public var remaining: Int?
    /// When the window started and when it resets (the next one starts), exactly.
    public var startsAt: Date
    public var resetsAt: Date
    /// The window's nominal length in seconds (86,400 or 2,592,000), for `RateLimit-Policy`.
    public var nominalSeconds: Int

    public init(name: String, limit: Int?, used: Int, remaining: Int?, startsAt: Date, resetsAt: Date, nominalSeconds: Int) {
        self.name = name
        self.limit = limit
        self.used = used
        self.remaining = remaining
        self.startsAt = startsAt
        self.resetsAt = resetsAt
        self.nominalSeconds = nominalSeconds
    }
}

/// A user's plan and windows.
@BinaryMessage
public struct QuotaStatus: Codable, Sendable, Equatable {
    public var userId: String
    public var plan: String
    public var isPro: Bool
    /// The user's IANA time zone; nil means UTC.
    public var timeZone: String?
    public var daily: QuotaWindow
    public var monthly: QuotaWindow
    /// Days the plan keeps history items.
    public var retentionDays: Int
    /// When the plan ends (the user is then on the default plan); nil when it does not.
    public var planEndsAt: Date?

    public init(userId: String, plan: String, isPro: Bool, timeZone: String?, daily: QuotaWindow, monthly: QuotaWindow, retentionDays: Int = 30, planEndsAt: Date? = nil) {
        self.userId = userId
        self.plan = plan
        self.isPro = isPro
        self.timeZone = timeZone
        self.daily = daily
        self.monthly = monthly
        self.retentionDays = retentionDays
        self.planEndsAt = planEndsAt
    }
}

/// The answer to `reserve`: admitted with the windows after the charge, or denied naming the
/// windows that are exhausted and when a retry can succeed.
@BinaryMessage
public struct QuotaDecision: Codable, Sendable, Equatable {
    public var admitted: Bool
    public var jobId: String
    public var status: QuotaStatus
    /// The windows that refused (`daily`, `monthly`); empty when admitted.
    public var violated: [String]
    /// When every violated window has reset, so a retry can succeed; nil when admitted.
    public var retryAt: Date?
    /// With `network` among the violated windows: the credits the guests' network has left today.
    public var networkRemaining: Int?
    /// True when the job id was charged before: its first admission answered again, nothing
    /// charged now (so a caller that refuses the job must not release a charge it did not make).
    public var replayed: Bool?
    /// How long quota remembers a settled charge's job id, in seconds (`IDEMPOTENCY_WINDOW_S`):
    /// past it, the id could be charged again, so a caller refuses an `Idempotency-Key` whose job
    /// is older. Nil from a quota that does not say.
    public var idempotencyWindow: Int?

    public init(admitted: Bool, jobId: String, status: QuotaStatus, violated: [String], retryAt: Date?, networkRemaining: Int? = nil,
                replayed: Bool? = nil, idempotencyWindow: Int? = nil) {
        self.admitted = admitted
        self.jobId = jobId
        self.status = status
        self.violated = violated
        self.retryAt = retryAt
        self.networkRemaining = networkRemaining
        self.replayed = replayed
        self.idempotencyWindow = idempotencyWindow
    }
}

/// A charge in the ledger.
public struct Charge: Codable, Sendable, Equatable {
    public enum State: String, Codable, Sendable {
        case reserved, committed, released
    }

    public var jobId: String
    public var userId: String
    public var cost: Int
    public var state: State
    /// The windows charged, as keys such as `2026-11-21` and `2026-11` in the user's zone.
    public var dayKey: String
    public var monthKey: String
    public var reservedAt: Date
    public var settledAt: Date?

    public init(jobId: String, userId: String, cost: Int, state: State, dayKey: String, monthKey: String, reservedAt: Date, settledAt: Date?) {
        self.jobId = jobId
        self.userId = userId
        self.cost = cost
        self.state = state
        self.dayKey = dayKey
        self.monthKey = monthKey
        self.reservedAt = reservedAt
        self.settledAt = settledAt
    }
}

/// Admin view: a user's status and their most recent charges.
public struct UserUsage: Codable, Sendable, Equatable {
    public var status: QuotaStatus
    public var charges: [Charge]

    public init(status: QuotaStatus, charges: [Charge]) {
        self.status = status
        self.charges = charges
    }
}

/// A plan of the catalogue.
public struct PlanDescription: Codable, Sendable, Equatable {
    public var name: String
    public var dailyLimit: Int?
    public var monthlyLimit: Int?
    public var isPro: Bool
    /// Days history keeps a user's items on this plan.
    public var retentionDays: Int

    public init(name: String, dailyLimit: Int?, monthlyLimit: Int?, isPro: Bool, retentionDays: Int) {
        self.name = name
        self.dailyLimit = dailyLimit
        self.monthlyLimit = monthlyLimit
        self.isPro = isPro
        self.retentionDays = retentionDays
    }
}
