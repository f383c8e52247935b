import Foundation
import HTTPTypes
import Hummingbird
import Messages
import NIOCore
import Synchronization

extension HTTPField.Name {
    /// The client network of a guest's request, set by `GuestAdmissionMiddleware` only (a
    /// client's own value is removed first).
    static let clientNetwork = HTTPField.Name("X-Photoedit-Client-Network")!
}

/// Guests cannot mint free edits by rotating device ids: a guest request (`X-Device-Id`, no
/// bearer token) from a client network (`ClientNetworks`) whose device id is new is admitted by
/// quota only while the network has made fewer than `QUOTA_GUESTS_PER_NETWORK_HOUR` new guests in
/// the last hour; past it, 429 naming the limit. The network goes on with the request, so a
/// guest's job is charged to its network's shared credits of the day as well. Device ids seen
/// before are remembered here (a bounded set), so a known guest costs no bus call.
///
/// With `attestedOnly` (`APP_ATTEST_REQUIRED`), only guests whose device was attested are
/// admitted (403 `attestation_required` otherwise). The attestation routes themselves pass.
struct GuestAdmissionMiddleware<Context: GatewayRequestContext>: RouterMiddleware {
    let clients: ServiceClients
    let networks: ClientNetworks
    var attestedOnly = false
    let known = KnownGuests(capacity: 100_000)

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var head = request.head
        head.headerFields[.clientNetwork] = nil
        guard request.headers[.authorization] == nil, let device = request.headers[.deviceId], let uuid = UUID(uuidString: device),
              !request.uri.path.hasPrefix(AttestationController<Context>.attestationPath),
              let network = networks.network(peer: context.remoteAddress, forwardedFor: request.headers[.xForwardedFor]) else {
            return try await next(head.headerFields == request.headers ? request : Request(head: head, body: request.body), context)
        }
        let userId = "device:\(uuid.uuidString.lowercased())"
        if !known.contains(userId) {
            let admission = try await clients.call(
                .quota, Quota.admitGuest, AdmitGuest(userId: userId, network: network, attestedOnly: attestedOnly ? true : nil)
            )
            guard admission.admitted else { throw Self.refused(admission) }
            known.insert(userId)
        }
        head.headerFields[.clientNetwork] = network
        return try await next(Request(head: head, body: request.body), context)
    }

    static func refused(_ admission: GuestAdmission) -> Problem {
        if admission.attestationRequired == true {
            return Problem(
                .forbidden, title: "Attestation required",
                detail: "Guests must attest their device first: \(AttestationController<Context>.challengePath), then \(AttestationController<Context>.attestationPath).",
                type: "/problems/attestation-required", extensions: ["code": .string("attestation_required")]
            )
        }
        let retryAfter = admission.retryAt.map { max(1, Int($0.timeIntervalSinceNow.rounded(.up))) } ?? 3600
        return Problem(
            .tooManyRequests,
            title: "Too many new guests",
            detail: "This network has made \(admission.limit) new guest accounts in the last hour; sign in, or try again in \(retryAfter) seconds.",
            type: "/problems/guest-limit",
            headers: [.retryAfter: "\(retryAfter)"],
            extensions: ["code": .string("guest_limit"), "limit": .int(admission.limit), "retryAfter": .int(retryAfter)]
        )
    }
}

/// Guest ids admitted before: a bounded set, emptied when full (a forgotten id is asked about
/// once more, and quota admits it again).
final class KnownGuests: Sendable {
    let capacity: Int
    private let ids = Mutex<Set<String>>([])
    init(capacity: Int) { self.capacity = capacity }
    func contains(_ id: String) -> Bool { ids.withLock { $0.contains(id) } }
    func insert(_ id: String) {
        ids.withLock { ids in
            if ids.count >= capacity { ids.removeAll(keepingCapacity: true) }
            ids.insert(id)
        }
    }
}

extension HTTPField.Name {
    static let xForwardedFor = HTTPField.Name("X-Forwarded-For")!
}
