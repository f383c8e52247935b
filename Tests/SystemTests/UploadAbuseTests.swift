import Blobs
@testable import GatewayApp
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import Testing

@Suite("Oversized, reused and bomb uploads", .serialized, .timeLimit(.minutes(5)))
struct UploadAbuseTests {
    /// Presigns an upload; returns the PUT path and the image key.
    static func presign(_ client: any TestClientProtocol, as user: HTTPFields, contentType: String) async throws -> (path: String, key: String) {
        let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                               body: ByteBuffer(string: #"{"filename": "a", "contentType": "\#(contentType)"}"#))
        let answer = JobSystem.json(presign)
        let url = try #require(answer["uploadUrl"] as? String)
        return (JobSystem.path(url), try #require(answer["imageKey"] as? String))
    }

    /// Files waiting in the blob store's incoming folder.
    static func incoming(_ system: JobSystem) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: system.blobDirectory + "/.incoming")) ?? []
    }

    @Test func oversizedUploadsAre413BeforeTheBodyEndsAndLeaveNothing() async throws {
        let system = try await JobSystem(workers: 0, uploadMaxBytes: 64 * 1024)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            let port = try #require(client.port)
            // Given a Content-Length over the limit, and only the first kilobyte of the body sent
            let (declared, declaredKey) = try await Self.presign(client, as: user, contentType: "image/jpeg")
            let first = try RawConnection(port: port)
            first.send("PUT \(declared) HTTP/1.1\r\nHost: gateway\r\nContent-Type: image/jpeg\r\nContent-Length: 10000000\r\n\r\n")
            first.send([UInt8](repeating: 0xFF, count: 1024))
            // Then the 413 comes at once, while the client still owes 9.99 MB
            let answer = await first.read(until: "\r\n\r\n")
            #expect(answer.hasPrefix("HTTP/1.1 413"), "answered \(answer.prefix(80))")
            first.close()

            // Given a chunked body (no Content-Length) that grows past the limit and never ends
            let (chunked, chunkedKey) = try await Self.presign(client, as: user, contentType: "image/jpeg")
            let second = try RawConnection(port: port)
            second.send("PUT \(chunked) HTTP/1.1\r\nHost: gateway\r\nContent-Type: image/jpeg\r\nTransfer-Encoding: chunked\r\n\r\n")
            let piece = [UInt8](repeating: 0xFF, count: 16 * 1024)
            for _ in 0..<6 { second.send(Array("4000\r\n".utf8) + piece + Array("\r\n".utf8)) }
            // Then it is 413 too, as a problem, without waiting for an end that never comes
            let chunkedAnswer = await second.read(until: "}")
            #expect(chunkedAnswer.hasPrefix("HTTP/1.1 413"), "answered \(chunkedAnswer.prefix(80))")
            #expect(chunkedAnswer.contains("application/problem+json") && chunkedAnswer.contains("upload_too_large"))
            second.close()

            // And neither left a file behind, in the store or half-written
            try await waitUntil { Self.incoming(system).isEmpty }
            #expect(!system.blobExists(declaredKey) && !system.blobExists(chunkedKey))
        }
        await system.stop()
    }

    @Test func anUploadKeyHoldsOneImageForGood() async throws {
        let system = try await JobSystem(workers: 0)
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            // Given an image uploaded through a presigned URL and a job made from it
            let (path, key) = try await Self.presign(client, as: user, contentType: "image/jpeg")
            let original = try Data(contentsOf: JobSystem.fixture)
            let first = try await client.execute(uri: path, method: .put, headers: [.contentType: "image/jpeg"], body: ByteBuffer(bytes: original))
            #expect(first.status == .created)
            #expect(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "copy").status == .accepted)
            // When the same URL is used again with other bytes, before it expires
            var other = original
            other[other.count - 10] ^= 0xFF
            let second = try await client.execute(uri: path, method: .put, headers: [.contentType: "image/jpeg"], body: ByteBuffer(bytes: other))
            // Then it is 409, and the first image is intact
            #expect(second.status == .conflict)
            #expect(JobSystem.json(second)["code"] as? String == "already_uploaded")
            let stored = try Data(contentsOf: URL(fileURLWithPath: system.blobDirectory).appendingPathComponent(key))
            #expect(stored == original)
            #expect(Self.incoming(system).isEmpty)
        }
        await system.stop()
    }

    @Test func thePixelLimitHoldsAtItsEdge() async throws {
        let system = try await JobSystem(workers: 1)
        system.configuration.imageMaxPixels = 100 * 100
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            func put(_ bytes: Data) async throws -> TestResponse {
                let (path, _) = try await Self.presign(client, as: user, contentType: "image/png")
                return try await client.execute(uri: path, method: .put, headers: [.contentType: "image/png"], body: ByteBuffer(bytes: bytes))
            }
            // An image of exactly the limit is taken, and a worker edits it
            let atLimit = try await put(TestImages.png(width: 100, height: 100))
            #expect(atLimit.status == .created)
            let key = try #require(JobSystem.json(atLimit)["imageKey"] as? String)
            let created = JobSystem.json(try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale"))
            let done = try await JobSystem.waitForStatus(client, as: user, jobId: try #require(created["jobId"] as? String))
            #expect(done["status"] as? String == "completed")
            // One row more is 422, naming the limit
            let over = try await put(TestImages.png(width: 100, height: 101))
            #expect(over.status == .unprocessableContent)
            let problem = JobSystem.json(over)
            #expect(problem["code"] as? String == "too_many_pixels" && problem["maxPixels"] as? Int == 10_000)
            #expect(over.headers[.contentType] == "application/problem+json")
            // And a 40000x40000 header over a few bytes (an image bomb) is refused from its header alone
            let bomb = try await put(TestImages.pngHeader(width: 40_000, height: 40_000))
            #expect(bomb.status == .unprocessableContent)
            #expect(Self.incoming(system).isEmpty)
        }
        await system.stop()
    }

    @Test func headersOfEveryAcceptedTypeGiveTheirSize() throws {
        let jpeg = try Data(contentsOf: JobSystem.fixture)
        let (width, height) = try JobSystem.dimensions(of: jpeg)
        #expect(ImageSize.read(Array(jpeg), contentType: "image/jpeg") == ImageSize(width: width, height: height))
        #expect(ImageSize.read(Array(TestImages.png(width: 7, height: 3)), contentType: "image/png") == ImageSize(width: 7, height: 3))
        // WebP: lossy, lossless and extended headers
        var lossy = Array("RIFF".utf8) + [0, 0, 0, 0] + Array("WEBPVP8 ".utf8) + [0, 0, 0, 0, 0, 0, 0, 0x9D, 0x01, 0x2A]
        lossy += [0x20, 0x03, 0x58, 0x02]  // 800 x 600
        #expect(ImageSize.read(lossy, contentType: "image/webp") == ImageSize(width: 800, height: 600))
        let bits = (640 - 1) | ((480 - 1) << 14)
        let lossless = Array("RIFF".utf8) + [0, 0, 0, 0] + Array("WEBPVP8L".utf8) + [0, 0, 0, 0, 0x2F]
            + [UInt8(bits & 0xFF), UInt8(bits >> 8 & 0xFF), UInt8(bits >> 16 & 0xFF), UInt8(bits >> 24 & 0xFF), 0, 0, 0, 0, 0]
        #expect(ImageSize.read(lossless, contentType: "image/webp") == ImageSize(width: 640, height: 480))
        let extended = Array("RIFF".utf8) + [0, 0, 0, 0] + Array("WEBPVP8X".utf8) + [0, 0, 0, 0, 0, 0, 0, 0]
            + [0x3F, 0x9C, 0x00, 0x3F, 0x9C, 0x00]  // 40000 x 40000
        #expect(ImageSize.read(extended, contentType: "image/webp")?.pixels == 1_600_000_000)
        // HEIC: the largest `ispe` property (the whole grid, not one tile)
        let heic = [0, 0, 0, 24] + Array("ftypheic".utf8) + [UInt8](repeating: 0, count: 12)
            + [0, 0, 0, 20] + Array("ispe".utf8) + [0, 0, 0, 0] + TestImages.be32(512) + TestImages.be32(512)
            + [0, 0, 0, 20] + Array("ispe".utf8) + [0, 0, 0, 0] + TestImages.be32(4032) + TestImages.be32(3024)
        #expect(ImageSize.read(heic, contentType: "image/heic") == ImageSize(width: 4032, height: 3024))
        // Cut short or garbage: unknown, never a guess
        #expect(ImageSize.read(Array(jpeg.prefix(20)), contentType: "image/jpeg") == nil)
        #expect(ImageSize.read([UInt8](repeating: 0xFF, count: 64), contentType: "image/png") == nil)
    }

    @Test func aWorkerRefusesAnInputOverThePixelLimitBeforeDecodingIt() async throws {
        let system = try await JobSystem(workers: 0)
        // Given an image over the limit that reached the store without the gateway's check
        let key = "uploads/elsewhere/large.png"
        let blobs = try await system.configuration.blobs.open()
        let user = "device:\(UUID().uuidString.lowercased())"
        try await blobs.put(key, from: .bytes(ByteBuffer(bytes: TestImages.png(width: 100, height: 101))), metadata: BlobMetadata(owner: user, contentType: "image/png"))
        try system.startWorker(extra: ["IMAGE_MAX_PIXELS": "10000"])
        // When a job is made of it
        let job = try await system.clients.jobs.call(Jobs.create, CreateJob(jobId: UUID().uuidString.lowercased(), userId: user, isPro: false, imageKey: key, effectId: "grayscale"))
        // Then the job fails at once, naming the limit, and is not retried
        try await waitUntil {
            try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user)).status == .failed
        }
        let failed = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: job.id, userId: user))
        #expect(failed.attempts == 1 && failed.lastError?.contains("over the limit of 10000 pixels") == true, "\(failed.lastError ?? "")")
        await system.stop()
    }

    /// Both ways a body is received: a small one (the photo) in memory, one over 1 MiB streamed
    /// to a staging file.
    @Test(arguments: [false, true])
    func aClientThatGoesAwayMidUploadIsCountedAndStoresNothingAndIsNoStorageFailure(large: Bool) async throws {
        let system = try await JobSystem(workers: 0)
        let (gateway, port) = try await ClientLibraryTests.gateway(system)
        // Given a presigned upload URL
        let presign = try RawConnection(port: port)
        let ask = #"{"filename": "a.jpg", "contentType": "image/jpeg"}"#
        presign.send("POST /api/v1/uploads/presigned HTTP/1.1\r\nHost: g\r\nX-Device-Id: \(UUID().uuidString)\r\nContent-Type: application/json\r\nContent-Length: \(ask.utf8.count)\r\nConnection: close\r\n\r\n\(ask)")
        let answer = await presign.read(until: "}")
        let body = try #require(answer.components(separatedBy: "\r\n\r\n").last)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
        let url = try #require(object["uploadUrl"] as? String)
        let key = try #require(object["imageKey"] as? String)
        // When the client sends a tenth of the image it announced and goes away
        var image = try Data(contentsOf: JobSystem.fixture)
        if large { image += Data(repeating: 0, count: UploadProblems.inMemoryBodyLimit) }
        let upload = try RawConnection(port: port)
        upload.send("PUT \(JobSystem.path(url)) HTTP/1.1\r\nHost: g\r\nContent-Type: image/jpeg\r\nContent-Length: \(image.count)\r\n\r\n")
        upload.send(Array(image.prefix(image.count / 10)))
        upload.close()
        // Then it is counted as a client abort, logged at debug, and nothing is stored
        try await waitUntil {
            let (_, exposition) = try await MetricsTests.scrape(port: port)
            return exposition.sum("gateway_uploads_aborted_total") >= 1
        }
        #expect(gateway.output.contains("upload abandoned by the client"))
        let errorLines = gateway.output.split(separator: "\n").filter { $0.contains("+0000 error ") || $0.contains("uploads cannot be stored") }
        #expect(errorLines.isEmpty, "\(errorLines)")
        #expect(!system.blobExists(key))
        await gateway.stop()
        await system.stop()
    }
}
