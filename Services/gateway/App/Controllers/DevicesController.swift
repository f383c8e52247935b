import Foundation
import Hummingbird
import Messages

/// The devices that hear of the caller's jobs by push notification:
/// - `PUT /api/v1/devices/{token}` with `{"platform": "apns" | "fcm"}` (or `ios` / `android`),
///   and for APNs `"environment": "production" | "sandbox"` (a development build's tokens are
///   the sandbox's): registers the token for the caller; the same token again updates it, and a
///   token another user had moves to the caller (it names the app on a device, which the caller
///   now signs in on). 200 with the device.
/// - `DELETE /api/v1/devices/{token}`: 204; a token the caller has not registered is 404.
///
/// When one of the caller's jobs completes or fails, each of their devices gets a notification
/// with the job's id and status (when the jobs service has APNs or FCM configured). Tokens the
/// push service reports as unregistered are forgotten.
struct DevicesController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let authenticator: Authenticator

    struct Body: Decodable {
        var platform: String
        var environment: String?
    }


    func addRoutes(to router: Router<Context>) {
        let router = router.authenticated(by: authenticator)
        router.put("/api/v1/devices/:token") { request, context in
            let token = try Self.token(context)
            let body = try await JSONBody.decode(Body.self, from: request, context: context)
            guard let platform = PushPlatform(client: body.platform) else {
                throw Problem(.badRequest, detail: "The field 'platform' must be apns (or ios) or fcm (or android).")
            }
            guard let environment = PushEnvironment(rawValue: body.environment ?? PushEnvironment.production.rawValue) else {
                throw Problem(.badRequest, detail: "The field 'environment' must be production or sandbox.")
            }
            let device = try await clients.call(.jobs, Devices.put, DeviceRegistration(
                userId: context.caller.id, token: token, platform: platform, environment: environment
            ))
            return try JSONResponse.make(.ok, device)
        }
        router.delete("/api/v1/devices/:token") { _, context in
            let token = try Self.token(context)
            _ = try await clients.call(.jobs, Devices.delete, DeviceReference(userId: context.caller.id, token: token))
            return Response(status: .noContent)
        }
    }

    static func token(_ context: some RequestContext) throws -> String {
        let token = try context.parameters.require("token")
        guard DeviceRegistration.isValid(token: token) else {
            throw Problem(.badRequest, detail: "A device token is 1 to \(Devices.maxTokenLength) letters, digits and -_:.")
        }
        return token
    }
}
