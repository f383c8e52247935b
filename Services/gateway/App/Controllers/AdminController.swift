import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Messages

/// Admin routes: a user's plan and time zone (the admin token), and their usage (the admin or
/// the viewer token).
struct AdminController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator
    let logger: Logger

    struct PlanChange: Decodable {
        var plan: String
        var timeZone: String?
        /// Until when the plan holds (ISO 8601, with or without fractions of a second); none,
        /// null or "": no end.
        var endsAt: String?

        func end() throws -> Date? {
            guard let endsAt, !endsAt.isEmpty else { return nil }
            guard let date = RFC3339.date(endsAt) else {
                throw Problem(.badRequest, detail: "endsAt must be an RFC 3339 date and time, such as 2026-12-31T23:59:59Z.")
            }
            return date
        }
    }

    struct CreditsChange: Decodable {
        /// Credits to grant; negative: to take back.
        var credits: Int
        /// Why, for the audit log (required).
        var reason: String
    }

    /// The `userId` path parameter, percent-decoded: a guest's `device:UUID` may arrive as
    /// `device%3AUUID`, and both name the same user.
    static func userId(_ context: Context) throws -> String {
        let raw = try context.parameters.require("userId")
        guard let decoded = raw.removingPercentEncoding, !decoded.isEmpty else {
            throw Problem(.badRequest, detail: "The user id in the path is not valid percent-encoding.")
        }
        return decoded
    }

    func addRoutes(to router: Router<Context>) {
        router.put("/admin/v1/users/:userId/plan") { request, context in
            try authenticator.requireAdmin(request)
            let userId = try Self.userId(context)
            let change = try await JSONBody.decode(PlanChange.self, from: request, context: context)
            let status = try await clients.call(.quota, Quota.setPlan, SetPlan(userId: userId, plan: change.plan, timeZone: change.timeZone, endsAt: try change.end()))
            // Written to the audit log after the change (a plan set twice is the same plan). The
            // change is made whatever becomes of the entry: one jobs could not take is logged.
            do {
                _ = try await clients.call(.jobs, Admin.audit, AuditEntry(
                    at: Date(), actor: "admin", action: "users.plan", target: userId, count: 1,
                    detail: "\(change.plan)\(change.endsAt.map { " until \($0)" } ?? "")"
                ))
            } catch {
                logger.warning("plan change not written to the audit log", metadata: ["user": "\(userId)", "plan": "\(change.plan)", "error": "\(error)"])
            }
            return try JSONResponse.make(.ok, status)
        }
        router.post("/admin/v1/users/:userId/credits") { request, context in
            try authenticator.requireAdmin(request)
            let userId = try Self.userId(context)
            let change = try await JSONBody.decode(CreditsChange.self, from: request, context: context)
            guard change.credits != 0, abs(change.credits) <= AdjustCredits.maxCredits else {
                throw Problem(.badRequest, detail: "credits must be 1 to \(AdjustCredits.maxCredits), or -1 to -\(AdjustCredits.maxCredits) to take them back.")
            }
            let reason = change.reason
            guard (1...500).contains(reason.utf8.count) else { throw Problem(.badRequest, detail: "reason must be 1 to 500 bytes.") }
            // An `Idempotency-Key` makes a resent request the same adjustment; without one each
            // request is a new one.
            var adjustmentId = UUID().uuidString.lowercased()
            if let key = request.headers[.idempotencyKey] {
                guard (1...128).contains(key.utf8.count) else { throw Problem(.badRequest, detail: "Idempotency-Key must be 1 to 128 bytes.") }
                adjustmentId = "key:" + key
            }
            let adjusted = try await clients.call(.quota, Quota.adjust, AdjustCredits(userId: userId, credits: change.credits, adjustmentId: adjustmentId))
            do {
                // A resend of an adjustment made before is written too, as changing nothing.
                _ = try await clients.call(.jobs, Admin.audit, AuditEntry(
                    at: Date(), actor: "admin", action: change.credits > 0 ? "users.grant" : "users.takeback", target: userId,
                    count: adjusted.applied ? abs(change.credits) : 0, detail: reason
                ))
            } catch {
                logger.warning("credit change not written to the audit log", metadata: ["user": "\(userId)", "credits": "\(change.credits)", "error": "\(error)"])
            }
            return try JSONResponse.make(.ok, adjusted.status)
        }
        router.get("/admin/v1/users/:userId/usage") { request, context in
            try authenticator.requireOperator(request)
            let userId = try Self.userId(context)
            let usage = try await clients.call(.quota, Quota.usage, UserReference(userId: userId))
            return try JSONResponse.make(.ok, usage)
        }
    }
}
