import AsyncHTTPClient
import Blobs
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Messages
import NIOCore
import PhotoEditKit
import Testing

/// The app's whole flow with `BLOB_STORE=s3` against the test RADOS Gateway: the app uploads
/// straight to the bucket, workers (with no store credentials and no blob folder) read and write
/// through presigned URLs, and every download is a presigned URL of the bucket.
@Suite("The app's flow on an object store", .serialized, .timeLimit(.minutes(5)))
struct ObjectStoreFlowTests {
    /// `GET url` with a plain HTTP client (as the app fetches a presigned URL); status and body.
    static func fetch(_ url: String) async throws -> (Int, ByteBuffer) {
        let request = HTTPClientRequest(url: url)
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
        return (Int(response.status.code), try await response.body.collect(upTo: 32 << 20))
    }

    @Test func uploadEditDownloadShareDeleteAndRerunThroughTheBucket() async throws {
        let system = try await JobSystem(workers: 1, blobs: .s3)
        let store = try await TestS3.store()
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            // The presigned upload URL is the bucket's own, with the headers to send
            let presign = try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                   body: ByteBuffer(string: #"{"filename": "photo.jpg", "contentType": "image/jpeg"}"#))
            let answer = JobSystem.json(presign)
            let uploadUrl = try #require(answer["uploadUrl"] as? String)
            #expect(uploadUrl.hasPrefix(store.configuration.endpoint.absoluteString) && uploadUrl.contains("X-Amz-Signature="))
            // Only the signed content type is required (the app's Chat screen sends nothing else)
            #expect(answer["headers"] as? [String: String] == ["Content-Type": "image/jpeg"])

            // The app's PUT goes straight to the bucket; the job runs on a worker that has only URLs
            let key = try await JobSystem.upload(client, as: user)
            let created = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale")
            #expect(created.status == .accepted)
            let jobId = try JobSystem.jobId(of: created)
            let status = try await JobSystem.waitForStatus(client, as: user, jobId: jobId)
            #expect(status["status"] as? String == "completed", "\(status)")

            // Result and 200x200 thumbnail come from presigned URLs of the bucket
            let resultUrl = try #require(status["resultUrl"] as? String)
            let thumbnailUrl = try #require(status["thumbnailUrl"] as? String)
            #expect(resultUrl.hasPrefix(store.configuration.endpoint.absoluteString) && thumbnailUrl.contains("X-Amz-Signature="))
            let (resultStatus, result) = try await Self.fetch(resultUrl)
            #expect(resultStatus == 200 && ImageSniffer.contentType(of: Array(result.readableBytesView.prefix(16))) == "image/jpeg")
            let (thumbnailStatus, thumbnail) = try await Self.fetch(thumbnailUrl)
            #expect(thumbnailStatus == 200)
            let (width, height) = try JobSystem.dimensions(of: Data(thumbnail.readableBytesView))
            #expect(max(width, height) == 200)

            // History lists it with bucket URLs; a share link redirects to a short-lived one
            var item: [String: Any] = [:]
            try await waitUntil {
                let body = try await JobSystem.get(client, "/api/v1/history", as: user).1
                item = (body["items"] as? [[String: Any]])?.first ?? [:]
                return item["status"] as? String == "completed"
            }
            #expect((item["thumbnailUrl"] as? String)?.contains("X-Amz-Signature=") == true)
            let share = try await client.execute(uri: "/api/v1/history/\(jobId)/share", method: .post, headers: user)
            let shareUrl = try #require(JobSystem.json(share)["shareUrl"] as? String)
            let opened = try await client.execute(uri: JobSystem.path(shareUrl), method: .get)
            #expect(opened.status == .found)
            let redirect = try #require(opened.headers[.location])
            #expect(try await Self.fetch(redirect).0 == 200)

            // A re-run makes a new job on the same original
            let rerun = try await client.execute(uri: "/api/v1/history/\(jobId)/rerun", method: .post, headers: user)
            #expect(rerun.status == .accepted)
            let rerunId = try JobSystem.jobId(of: rerun)
            #expect(try await JobSystem.waitForStatus(client, as: user, jobId: rerunId)["status"] as? String == "completed")

            // Deleting the first item removes its objects from the bucket; the original, still used
            // by the re-run, stays
            let resultKey = "results/\(jobId)/1.jpg", thumbnailKey = "thumbnails/\(jobId)/1.jpg"
            #expect(try await store.head(resultKey) != nil)
            #expect(try await client.execute(uri: "/api/v1/history/\(jobId)", method: .delete, headers: user).status == .ok)
            try await waitUntil {
                let result = try await store.head(resultKey), thumbnail = try await store.head(thumbnailKey)
                return result == nil && thumbnail == nil
            }
            #expect(try await Self.fetch(resultUrl).0 == 404)
            #expect(try await client.execute(uri: JobSystem.path(shareUrl), method: .get).status == .notFound)
            #expect(try await store.head(key) != nil)
        }
        await system.stop()
    }

    @Test func whatTheGatewaysUploadCheckedIsCheckedAtJobCreationAndRefusedObjectsGo() async throws {
        let system = try await JobSystem(workers: 1, uploadMaxBytes: 200_000, blobs: .s3)
        let store = try await TestS3.store()
        let user = JobSystem.guest(UUID())
        try await system.gateway { client in
            func refused(_ bytes: Data, contentType: String = "image/jpeg") async throws -> (TestResponse, String) {
                let key = try await JobSystem.upload(client, as: user, bytes: bytes, contentType: contentType)
                return (try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale"), key)
            }
            // Over the size limit: 413, as the gateway's own upload answers
            let (large, largeKey) = try await refused(Data(repeating: 0xFF, count: 3) + Data(count: 250_000))
            #expect(large.status == .contentTooLarge && JobSystem.json(large)["code"] as? String == "upload_too_large")
            // Not an image of the signed type: 415
            let (text, textKey) = try await refused(Data("just some text, not a jpeg".utf8))
            #expect(text.status == .unsupportedMediaType)
            // A 40000x40000 PNG header (an image bomb): 422 with the limit and the size
            let (bomb, bombKey) = try await refused(TestImages.pngHeader(width: 40_000, height: 40_000), contentType: "image/png")
            #expect(bomb.status == .unprocessableContent)
            let bombBody = JobSystem.json(bomb)
            #expect(bombBody["code"] as? String == "too_many_pixels" && bombBody["width"] as? Int == 40_000)
            // Each refused object is deleted
            for key in [largeKey, textKey, bombKey] { #expect(try await store.head(key) == nil, "\(key)") }

            // Someone else's key: 404, and the object is theirs still
            let theirs = try await JobSystem.upload(client, as: JobSystem.guest(UUID()))
            #expect(try await JobSystem.createJob(client, as: user, imageKey: theirs, effect: "grayscale").status == .notFound)
            #expect(try await store.head(theirs) != nil)
            // A key that holds no object: 404
            let nothing = "uploads/\(theirs.split(separator: "/")[1])/\(UUID().uuidString.lowercased()).jpg"
            #expect(try await JobSystem.createJob(client, as: user, imageKey: nothing, effect: "grayscale").status == .notFound)

            // Nothing was processed, and nothing charged
            let jobs = try await JobSystem.get(client, "/api/v1/history", as: user).1
            #expect(JobSystem.ids(jobs).isEmpty)
            let me = try await JobSystem.get(client, "/api/v1/users/me", as: user).1
            #expect((me["quota"] as? [String: Any])?["dailyUsed"] as? Int == 0)
        }
        await system.stop()
    }

    /// A client that PUTs without `If-None-Match` may PUT to its upload URL again until the URL
    /// expires. A job is pinned to the version of the image the gateway checked: a replaced
    /// image fails the job for good with its credits back, and a re-run of it is refused.
    @Test func aJobReadsOnlyTheVersionOfTheImageItWasCreatedFrom() async throws {
        let system = try await JobSystem(workers: 0, blobs: .s3)
        let store = try await TestS3.store()
        let device = UUID()
        let user = JobSystem.guest(device), userId = "device:\(device.uuidString.lowercased())"
        try await system.gateway { client in
            // Given an upload made with only Content-Type, and a job created from it (no worker yet)
            let presign = JobSystem.json(try await client.execute(uri: "/api/v1/uploads/presigned", method: .post, headers: user,
                                                                  body: ByteBuffer(string: #"{"filename": "a.jpg", "contentType": "image/jpeg"}"#)))
            let url = try #require(presign["uploadUrl"] as? String), key = try #require(presign["imageKey"] as? String)
            func put(_ bytes: Data) async throws -> Int {
                var request = HTTPClientRequest(url: url)
                request.method = .PUT
                request.headers.add(name: "Content-Type", value: "image/jpeg")
                request.body = .bytes(ByteBuffer(bytes: bytes))
                return Int(try await HTTPClient.shared.execute(request, timeout: .seconds(30)).status.code)
            }
            let photo = try Data(contentsOf: JobSystem.fixture)
            #expect(try await put(photo) == 200)
            let first = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale")
            #expect(first.status == .accepted)
            let firstId = try JobSystem.jobId(of: first)
            let checked = try #require(try await store.head(key)?.etag)

            // When the client PUTs another image to the same URL (a JPEG still: bytes after its end)
            #expect(try await put(photo + Data("another version".utf8)) == 200)
            #expect(try await store.head(key)?.etag != checked)

            // Then a re-run of the job is refused: its image is not the one it was created from
            let rerun = try await client.execute(uri: "/api/v1/jobs/\(firstId)/rerun", method: .post, headers: user)
            #expect(rerun.status == .conflict && JobSystem.json(rerun)["code"] as? String == "image_replaced", "\(rerun.status)")
            // A new job from the key is checked again, and pinned to the new version
            let second = try await JobSystem.createJob(client, as: user, imageKey: key, effect: "grayscale")
            #expect(second.status == .accepted)
            let secondId = try JobSystem.jobId(of: second)

            // And once a worker runs them, the first fails for good and gives its credit back,
            // the second completes
            try system.startWorker()
            let failed = try await JobSystem.waitForStatus(client, as: user, jobId: firstId)
            #expect(failed["status"] as? String == "failed" && (failed["error"] as? String)?.contains("replaced") == true, "\(failed)")
            let job = try await system.clients.jobs.call(Jobs.get, JobReference(jobId: firstId, userId: userId))
            #expect(job.attempts == 1, "a replaced input is not retried")
            #expect(try await JobSystem.waitForStatus(client, as: user, jobId: secondId)["status"] as? String == "completed")
            try await waitUntil {
                let charges = try await system.clients.quota.call(Quota.usage, UserReference(userId: userId)).charges
                return charges.first { $0.jobId == firstId }?.state == .released && charges.first { $0.jobId == secondId }?.state == .committed
            }
        }
        await system.stop()
    }

    @Test func theClientLibraryUploadsStraightToTheBucketAndDownloadsFromIt() async throws {
        let system = try await JobSystem(workers: 1, blobs: .s3)
        let store = try await TestS3.store()
        let (gateway, port) = try await ClientLibraryTests.gateway(system, extra: system.storeEnvironment)
        let app = ClientLibraryTests.client(port)
        let photo = try Data(contentsOf: JobSystem.fixture)
        // The library sends the PUT to the bucket with the signed headers it was given
        let key = try await app.upload(photo)
        #expect(try await store.head(key)?.size == photo.count)
        let ticket = try await app.createJob(imageKey: key, effect: "copy")
        var last: JobUpdate?
        for try await update in app.updates(of: ticket.jobId) { last = update }
        #expect(last?.status == "completed", "\(String(describing: last))")
        // And downloads the result from the bucket's presigned URL: the photo as it was uploaded
        let result = try await app.download(try #require(last?.resultUrl))
        #expect(result == photo)
        await gateway.stop()
        await system.stop()
    }
}
