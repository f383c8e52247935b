import Bus
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// Admin routes, behind the admin token: a user's plan and time zone, and their usage.
struct AdminController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator

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
            return try JSONResponse.make(.ok, status)
        }
        router.get("/admin/v1/users/:userId/usage") { request, context in
            try authenticator.requireAdmin(request)
            let userId = try Self.userId(context)
            let usage = try await clients.call(.quota, Quota.usage, UserReference(userId: userId))
            return try JSONResponse.make(.ok, usage)
        }
    }
}
