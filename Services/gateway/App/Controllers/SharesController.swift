import Blobs
import Foundation
import Hummingbird
import Messages

/// `GET /s/{token}`: a share link, public: the shared result's bytes while the link lives; 404
/// once it is revoked, expired or its item deleted.
struct SharesController<Context: RequestContext>: Sendable {
    let clients: ServiceClients
    let blobs: DiskBlobStore

    func addRoutes(to router: Router<Context>) {
        router.get("/s/:token") { _, context in
            let token = try context.parameters.require("token")
            let shared = try await clients.call(.history, History.openShare, ShareToken(token: token))
            guard let metadata = try await blobs.metadata(of: shared.resultKey), let file = try? await blobs.localFile(for: shared.resultKey) else {
                throw Problem(.notFound, detail: "The shared result is no longer there.")
            }
            let body = try await FileIO().loadFile(path: file.path, context: context)
            return Response(status: .ok, headers: [.contentType: metadata.contentType, .cacheControl: "private, no-store"], body: body)
        }
    }
}
