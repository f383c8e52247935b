import Foundation
@testable import GatewayApp
import Messages
import Testing

/// `POST /api/v1/jobs`'s 202 body, written by hand: byte for byte what `JSONEncoder` with sorted
/// keys and ISO 8601 dates wrote from the shape below (the route's shape before, kept here as the
/// reference).
@Suite("Job accepted JSON", .timeLimit(.minutes(5)))
struct JobAcceptedJSONTests {
    struct Accepted: Encodable {
        var jobId: String
        var status: JobStatus
        var createdAt: Date
    }

    @Test func theBodyIsWhatJSONEncoderWrote() throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for (id, created) in [("0b6f5c1e-2a9d-4c1b-9f6e-3d2a1b0c9e8f", 1_795_000_000.999), ("a\"b\\c/ü", 0.0), ("x", -1.5)] {
            for status in JobStatus.allCases {
                let job = JobRecord(
                    id: id, userId: "device:u", isPro: false, imageKey: "uploads/u/a.jpg", effectId: "copy", parameters: [:], prompt: nil,
                    status: status, progress: 0, attempts: 0, maxAttempts: 3, lastError: nil, resultKey: nil, thumbnailKey: nil,
                    createdAt: Date(timeIntervalSince1970: created),
                    updatedAt: Date(timeIntervalSince1970: created), startedAt: nil, finishedAt: nil, version: 1
                )
                let expected = try encoder.encode(Accepted(jobId: job.id, status: job.status, createdAt: job.createdAt))
                #expect(String(decoding: JobCreator.accepted(job), as: UTF8.self) == String(decoding: expected, as: UTF8.self))
            }
        }
    }
}
