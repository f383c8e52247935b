import AsyncHTTPClient
import Blobs
import Foundation
import NIOCore
import Testing

/// The S3 store's contract against a real RADOS Gateway (Ceph, from Debian), started by the test
/// scripts: every call the services make, and presigned URLs used by a plain HTTP client as the
/// app and the workers use them.
@Suite(.serialized, .timeLimit(.minutes(5))) struct S3BlobStoreTests {
    let store: S3BlobStore
    let prefix = "tests/\(UUID().uuidString.lowercased())"

    init() async throws {
        store = try await TestS3.store()
    }

    static func bytes(_ count: Int) -> ByteBuffer {
        ByteBuffer(bytes: (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
    }

    static func send(_ url: String, method: String = "GET", headers: [String: String] = [:], body: ByteBuffer? = nil) async throws -> (Int, ByteBuffer) {
        var request = HTTPClientRequest(url: url)
        request.method = .init(rawValue: method)
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(body) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
        return (Int(response.status.code), try await response.body.collect(upTo: 16 << 20))
    }

    @Test func putThenGetHeadAndDeleteRoundTrip() async throws {
        let key = "\(prefix)/a.jpg"
        let data = Self.bytes(300_000)
        try await store.put(key, from: .bytes(data), metadata: BlobMetadata(owner: "user-1", contentType: "image/jpeg"))

        let head = try #require(try await store.head(key))
        #expect(head.size == 300_000 && head.contentType == "image/jpeg" && head.owner == "user-1")
        #expect(try await store.bytes(of: key) == data)

        try await store.delete(key)
        #expect(try await store.head(key) == nil)
        await #expect(throws: BlobError.notFound) { try await store.open(key) }
        try await store.delete(key)  // deleting nothing is no error
    }

    @Test func rangesReadTheAskedBytesAndKnowTheWholeSize() async throws {
        let key = "\(prefix)/range.bin"
        let data = Self.bytes(100_000)
        try await store.put(key, from: .bytes(data), metadata: BlobMetadata(owner: "", contentType: "application/octet-stream"))
        let reader = try await store.open(key, range: 10...19)
        #expect(reader.range == 10...19 && reader.length == 10 && reader.metadata.size == 100_000)
        var got = ByteBuffer()
        for try await var chunk in reader.body { got.writeBuffer(&chunk) }
        #expect(got == data.getSlice(at: 10, length: 10))
        // A range past the end is cut to the blob's size.
        #expect(try await store.bytes(of: key, range: 99_990...200_000) == data.getSlice(at: 99_990, length: 10))
    }

    @Test func putFromAFileStreamsIt() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("s3-put-\(UUID().uuidString)")
        let data = Self.bytes(2 << 20)
        try Data(data.readableBytesView).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let key = "\(prefix)/file.bin"
        try await store.put(key, from: .file(file), metadata: BlobMetadata(owner: "", contentType: "application/octet-stream"))
        #expect(try await store.bytes(of: key) == data)
    }

    @Test func onlyIfAbsentWritesOnceAndOneOfManyWriters() async throws {
        let key = "\(prefix)/once.jpg"
        try await store.put(key, from: .bytes(Self.bytes(10)), metadata: BlobMetadata(owner: "", contentType: "image/jpeg"), ifAbsent: true)
        await #expect(throws: BlobError.exists) {
            try await store.put(key, from: .bytes(Self.bytes(20)), metadata: BlobMetadata(owner: "", contentType: "image/jpeg"), ifAbsent: true)
        }
        #expect(try await store.head(key)?.size == 10)

        let raced = "\(prefix)/raced.jpg"
        let shared = store
        let wins = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<8 {
                group.addTask {
                    do {
                        try await shared.put(raced, from: .bytes(Self.bytes(100 + index)), metadata: BlobMetadata(owner: "", contentType: "image/jpeg"), ifAbsent: true)
                        return true
                    } catch { return false }
                }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(wins == 1)
    }

    @Test func listFindsKeysUnderAPrefixWrittenBeforeADate() async throws {
        for name in ["x/1", "x/2", "y/3"] {
            try await store.put("\(prefix)/\(name)", from: .bytes(Self.bytes(5)), metadata: BlobMetadata(owner: "", contentType: "text/plain"))
        }
        let listed = try await store.list(prefix: "\(prefix)/x/", modifiedBefore: Date().addingTimeInterval(60), limit: 100)
        #expect(Set(listed) == ["\(prefix)/x/1", "\(prefix)/x/2"])
        #expect(try await store.list(prefix: "\(prefix)/x/", modifiedBefore: Date().addingTimeInterval(-3600), limit: 100).isEmpty)
    }

    @Test func presignedGetWorksForAPlainClientUntilItExpires() async throws {
        let key = "\(prefix)/shared.jpg"
        let data = Self.bytes(1000)
        try await store.put(key, from: .bytes(data), metadata: BlobMetadata(owner: "", contentType: "image/jpeg"))

        let url = store.presignedGET(key, expiresIn: 60, now: Date())
        let (status, body) = try await Self.send(url)
        #expect(status == 200 && body == data)

        // Signed 120 s ago for 60 s: expired.
        let expired = store.presignedGET(key, expiresIn: 60, now: Date().addingTimeInterval(-120))
        #expect(try await Self.send(expired).0 == 403)

        // One character of the signature changed.
        let last = url.last == "0" ? "1" : "0"
        #expect(try await Self.send(String(url.dropLast()) + last).0 == 403)
        // Another key under the same signature.
        #expect(try await Self.send(url.replacingOccurrences(of: "shared.jpg", with: "other.jpg")).0 == 403)
    }

    /// The seeds' Chat screen PUTs with only `Content-Type`: that is all a presigned upload
    /// needs. A client that adds `If-None-Match: *` writes the key once.
    @Test func presignedPutNeedsOnlyTheSignedTypeAndWritesOnceWhenAsked() async throws {
        let key = "\(prefix)/upload.png"
        let put = store.presignedPUT(key, contentType: "image/png", owner: "u", expiresIn: 60, now: Date())
        #expect(put.headers == ["Content-Type": "image/png"])

        // Another content type than the one signed: refused.
        #expect(try await Self.send(put.url, method: "PUT", headers: ["Content-Type": "image/jpeg"], body: Self.bytes(10)).0 == 403)

        // Only the content type, as the app sends it: stored.
        #expect(try await Self.send(put.url, method: "PUT", headers: ["Content-Type": "image/png"], body: Self.bytes(64)).0 == 200)
        let first = try #require(try await store.head(key))
        #expect(first.contentType == "image/png" && first.size == 64)
        let firstTag = try #require(first.etag)
        // With If-None-Match (unsigned, honoured): the key holds an object, so nothing is written.
        #expect(try await Self.send(put.url, method: "PUT", headers: ["Content-Type": "image/png", "If-None-Match": "*"], body: Self.bytes(99)).0 == 412)
        #expect(try await store.head(key)?.size == 64)
        // A fresh key with If-None-Match: written.
        let fresh = store.presignedPUT("\(prefix)/once.png", contentType: "image/png", owner: "u", expiresIn: 60, now: Date())
        #expect(try await Self.send(fresh.url, method: "PUT", headers: ["Content-Type": "image/png", "If-None-Match": "*"], body: Self.bytes(10)).0 == 200)

        // Without it the same URL replaces the object (until the URL expires): a new version,
        // which a read pinned to the first version (If-Match, as a worker reads a job's input)
        // does not get.
        #expect(try await Self.send(put.url, method: "PUT", headers: ["Content-Type": "image/png"], body: Self.bytes(99)).0 == 200)
        let second = try #require(try await store.head(key))
        #expect(second.size == 99 && second.etag != nil && second.etag != firstTag)
        let read = store.presignedGET(key, expiresIn: 60, now: Date())
        #expect(try await Self.send(read, headers: ["If-Match": firstTag]).0 == 412)
        let (status, body) = try await Self.send(read, headers: ["If-Match": second.etag!])
        #expect(status == 200 && body.readableBytes == 99)
        // The version a ranged read saw is named with its bytes.
        #expect(try await store.open(key, range: 0...9).metadata.etag == second.etag)

        let expired = store.presignedPUT("\(prefix)/late.png", contentType: "image/png", owner: "u", expiresIn: 1, now: Date().addingTimeInterval(-60))
        #expect(try await Self.send(expired.url, method: "PUT", headers: expired.headers, body: Self.bytes(10)).0 == 403)
    }

    @Test func wrongCredentialsAndMissingBucketsAreConfigurationErrorsAtOpen() async throws {
        var wrong = try TestS3.configuration()
        wrong.credentials.secretAccessKey = "not-the-secret"
        await #expect { try await S3BlobStore.open(wrong) } throws: { error in
            let error = error as? BlobStoreError
            return error?.kind == .misconfigured && error?.description.contains("not-the-secret") == false
        }
        let secret = try TestS3.configuration().credentials.secretAccessKey
        let configuration = try TestS3.configuration()
        #expect(!"\(store)".contains(secret) && !String(reflecting: configuration).contains(secret))
        var missing = try TestS3.configuration()
        missing.bucket = "no-such-bucket-\(UInt32.random(in: 0...UInt32.max))"
        await #expect { try await S3BlobStore.open(missing) } throws: { ($0 as? BlobStoreError)?.description.contains("does not exist") == true }
    }

    @Test func anUnreachableStoreIsUnavailableAfterRetries() async throws {
        var gone = try TestS3.configuration()
        gone.endpoint = URL(string: "http://127.0.0.1:9")!
        gone.maxAttempts = 2
        gone.timeout = .seconds(2)
        await #expect { try await S3BlobStore.open(gone) } throws: { ($0 as? BlobStoreError)?.kind == .unavailable }
    }

    @Test func aStoreThatStopsAnsweringFailsAHeadWithinItsControlTimeout() async throws {
        // Given a store reached through a proxy, opened
        var configuration = try TestS3.configuration()
        let upstream = try #require(configuration.endpoint.port)
        let proxy = try #require(FreezableProxy(upstream: upstream))
        defer { proxy.stop() }
        configuration.endpoint = try #require(URL(string: "http://127.0.0.1:\(proxy.port)"))
        configuration.controlTimeout = .seconds(3)
        let store = try await S3BlobStore.open(configuration)
        // When it stops answering (a partition between this process and the store: connections
        // neither refused nor answered)
        proxy.freeze()
        // Then a HEAD, what an upload's check before its job waits on, fails as unavailable once
        // its control timeout has passed, not after its attempts' 2 minutes (4 × 30 s)
        let took = await ContinuousClock().measure {
            await #expect { _ = try await store.head("any/key.jpg") } throws: { ($0 as? BlobStoreError)?.kind == .unavailable }
        }
        #expect(took < .seconds(30), "answered after \(took)")
    }
}
