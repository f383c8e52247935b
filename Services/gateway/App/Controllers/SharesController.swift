import Blobs
import Foundation
import Hummingbird
import Messages

/// `GET /s/{token}`: a share link, public. While the link lives: with the folder store, the shared
/// result's bytes; with an object store, a redirect to a presigned URL of the result that lives
/// `redirectLifetime` seconds. 404 once it is revoked, expired or its item deleted (a redirect
/// already handed out works until its own short expiry).
struct SharesController<Context: GatewayRequestContext>: Sendable {
    let clients: ServiceClients
    let blobs: any BlobStore
    /// Seconds a share's redirect URL lives (60).
    let redirectLifetime: Int

    func addRoutes(to router: Router<Context>) {
        router.get("/s/:token") { _, context in
            let token = try context.parameters.require("token")
            let shared = try await clients.call(.history, History.openShare, ShareToken(token: token))
            guard blobs.kind == .folder else {
                return Response(status: .found, headers: [
                    .location: blobs.presignedGET(shared.resultKey, expiresIn: redirectLifetime, now: Date()), .cacheControl: "private, no-store",
                ])
            }
            do {
                return try await UploadsController<Context>.serve(blobs, key: shared.resultKey, cacheControl: "private, no-store")
            } catch let problem as Problem where problem.status == .notFound {
                throw Problem(.notFound, detail: "The shared result is no longer there.")
            }
        }
    }
}
