import Blobs
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Messages

/// Creates jobs for the routes that start one (a new edit, a re-run from a job or from history):
/// checks the image is the caller's, reserves the effect's price in credits for the job id, asks
/// jobs to create the job, and gives the credits back when creation definitely failed.
struct JobCreator: Sendable {
    let clients: ServiceClients
    /// The upload checks (owner, type, size, pixels), remembered for a minute once passed.
    let uploads: UploadCheck
    /// Each effect's price now (a re-run pays its model's price of today, not the original's).
    let prices: EffectPrices
    /// How long an `Idempotency-Key` names its job, in seconds, at most: quota's own window, told
    /// with each decision, is taken when it is shorter (quota forgets a settled charge after it).
    let idempotencyWindow: TimeInterval

    /// Validates, reserves quota for the job id, creates the job; releases on a definite failure.
    /// `network` is a guest's client network (from `GuestAdmissionMiddleware`): its guests share
    /// the day's free credits. `version`: a re-run's, the version of the image its job was
    /// created from (409 if the key holds another now); the new job is pinned to the version
    /// checked.
    func create(caller: Caller, imageKey: String, version: String? = nil, effect: String, parameters: [String: Double], prompt: String?,
                idempotencyKey: String?, network: String? = nil) async throws -> Response {
        let priced = try await prices.effect(effect)
        let image = try await uploads.verify(imageKey, of: caller, version: version)
        let jobId = try Self.jobId(user: caller.id, idempotencyKey: idempotencyKey)
        let decision = try await clients.call(.quota, Quota.reserve, ReserveQuota(userId: caller.id, jobId: jobId, cost: priced.credits, network: caller.isGuest ? network : nil))
        guard decision.admitted else {
            throw RateLimitHeaders.problem(for: decision, needed: priced.credits, now: Date())
        }
        let job: JobRecord
        do {
            job = try await clients.client(for: .jobs).call(Jobs.create, CreateJob(
                jobId: jobId, userId: caller.id, isPro: decision.status.isPro, imageKey: imageKey,
                effectId: effect, parameters: parameters, prompt: prompt, credits: priced.credits, imageETag: image.etag
            ))
        } catch {
            // A definite answer means no job exists: give the units back. A timeout, a lost
            // connection or a storage failure (a database connection lost at the commit) may
            // hide a created job; quota resolves such reservations by asking jobs later.
            if ![.timeout, .connectionLost, .storageUnavailable].contains(error.code) {
                _ = try? await clients.client(for: .quota).call(Quota.release, ChargeReference(jobId: jobId))
            }
            throw Problem(error, service: "jobs")
        }
        let window = min(idempotencyWindow, decision.idempotencyWindow.map(TimeInterval.init) ?? idempotencyWindow)
        if idempotencyKey != nil, job.createdAt < Date().addingTimeInterval(-window) {
            // The key named a job made before the window: quota may have forgotten its charge
            // and charged this id again. That charge (not one quota only answered again) goes
            // back, and the request is refused rather than answered with an old job.
            if decision.replayed != true {
                _ = try? await clients.client(for: .quota).call(Quota.release, ChargeReference(jobId: jobId))
            }
            throw Problem(.conflict, detail: "This Idempotency-Key was first used more than \(Int(window)) seconds ago; send a new key for a new edit.",
                          extensions: ["code": .string("idempotency_key_expired")])
        }
        var headers: HTTPFields = [.location: "/api/v1/jobs/\(job.id)", .contentType: "application/json"]
        headers.append(contentsOf: RateLimitHeaders.headers(for: decision.status, now: Date()))
        return Response(status: .accepted, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: Self.accepted(job))))
    }

    /// `{"createdAt", "jobId", "status"}`, the keys in sorted order and the date to the second,
    /// as `JSONEncoder` wrote it, without one (its generic encoding was 2% of the machine in
    /// `make bench-gateway`'s job creations).
    static func accepted(_ job: JobRecord) -> [UInt8] {
        var out = JSONBytes(capacity: 128)
        out.raw("{\"createdAt\":")
        out.date(job.createdAt)
        out.raw(",\"jobId\":")
        out.string(job.id)
        out.raw(",\"status\":")
        out.string(job.status.rawValue)
        out.raw("}")
        return out.bytes
    }

    /// With an `Idempotency-Key`, the job id is derived from (user, key): the same request sent
    /// again names the same job, which is created and charged once. Without one it is
    /// time-ordered (`TimeOrderedID`), so new jobs land on the stores' last pages.
    static func jobId(user: String, idempotencyKey: String?) throws -> String {
        guard let key = idempotencyKey else { return TimeOrderedID.make() }
        guard (1...255).contains(key.utf8.count) else {
            throw Problem(.badRequest, detail: "Idempotency-Key must be 1 to 255 characters.")
        }
        var bytes = Array(SHA256.hash(data: Data("\(user)\n\(key)".utf8)).prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x50  // name-based UUID layout
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                               bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
        return uuid.uuidString.lowercased()
    }
}

extension HTTPField.Name {
    /// `Idempotency-Key`: the same key from the same user names the same job.
    public static let idempotencyKey = HTTPField.Name("Idempotency-Key")!
}
