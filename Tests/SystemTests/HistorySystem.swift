import Foundation
import GRDB
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import JWTKit
import Messages
import Testing

/// Steps of the history tests on top of `JobSystem`.
extension JobSystem {
    /// A signed-in user's headers (a JWT for `sub`).
    static func signedIn(_ sub: String) async throws -> HTTPFields {
        [.authorization: "Bearer \(try await token(sub))"]
    }

    /// A JWT for `sub`, valid for an hour, signed with `secret` (the test gateway's by default).
    static func token(_ sub: String, secret: String = JobSystem.secret) async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return try await keys.sign(TestClaims(sub: .init(value: sub), exp: .init(value: Date().addingTimeInterval(3600)), email: nil))
    }

    /// The user id of a guest's headers.
    static func userId(ofGuest headers: HTTPFields) -> String { "device:" + headers[.deviceId]!.lowercased() }

    /// Feeds job events straight to history, as jobs' outbox does.
    func feedHistory(_ events: [JobEvent]) async throws {
        _ = try await clients.history.call(History.apply, JobEvents(events: events))
    }

    /// `GET uri` as `user`; the answer and its JSON.
    static func get(_ client: any TestClientProtocol, _ uri: String, as user: HTTPFields, headers: HTTPFields = [:]) async throws -> (TestResponse, [String: Any]) {
        var all = user
        all.append(contentsOf: headers)
        let response = try await client.execute(uri: uri, method: .get, headers: all)
        return (response, json(response))
    }

    /// The job ids of a history answer's items.
    static func ids(_ body: [String: Any], key: String = "items", id: String = "id") -> [String] {
        (body[key] as? [[String: Any]] ?? []).compactMap { $0[id] as? String }
    }

    /// Jobs whose current version history has not had yet, read from the jobs service's file
    /// without writing.
    func jobsDueForHistory() throws -> Int {
        var configuration = Configuration()
        configuration.readonly = true
        let queue = try DatabaseQueue(path: services.dataDirectory.appendingPathComponent("jobs.sqlite").path, configuration: configuration)
        return try queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM job WHERE historyDueAt IS NOT NULL") ?? 0 }
    }

    /// Whether the blob `key` is on disk.
    func blobExists(_ key: String) -> Bool {
        FileManager.default.fileExists(atPath: URL(fileURLWithPath: blobDirectory).appendingPathComponent(key).path)
    }

    /// Creates a job with `prompt` and waits until it has ended; returns its id.
    static func finishedJob(_ client: any TestClientProtocol, as user: HTTPFields, imageKey: String, effect: String = "copy", prompt: String? = nil) async throws -> String {
        let created = try await createJob(client, as: user, imageKey: imageKey, effect: effect, prompt: prompt)
        #expect(created.status == .accepted)
        let jobId = try jobId(of: created)
        _ = try await waitForStatus(client, as: user, jobId: jobId)
        return jobId
    }
}

/// A job event as jobs emits it, for feeding history directly.
func jobEvent(
    _ id: String, user: String, status: JobStatus = .completed, version: Int = 3, prompt: String? = "a prompt",
    createdAt: Date = Date(), effectId: String = "blur", effectTitle: String = "Soft Focus"
) -> JobEvent {
    JobEvent(
        job: JobRecord(
            id: id, userId: user, isPro: false, imageKey: "uploads/none/\(id).jpg", effectId: effectId, parameters: [:], prompt: prompt,
            status: status, progress: status == .completed ? 1 : 0, attempts: 1, maxAttempts: 3, lastError: status == .failed ? "it broke" : nil,
            resultKey: status == .completed ? "results/\(id)/1.jpg" : nil, thumbnailKey: status == .completed ? "thumbnails/\(id)/1.jpg" : nil,
            createdAt: createdAt, updatedAt: createdAt, startedAt: nil, finishedAt: nil, version: version
        ),
        effectTitle: effectTitle
    )
}
