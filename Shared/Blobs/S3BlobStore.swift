import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// Blobs in a bucket of an S3-compatible store (AWS S3, Cloudflare R2, MinIO, Ceph's RADOS
/// Gateway), over AsyncHTTPClient with `SigV4`. Requests follow S3's API reference (PutObject,
/// GetObject, HeadObject, DeleteObject, ListObjectsV2, HeadBucket). Transport errors, 5xx and
/// `SlowDown` are retried with backoff; what still fails is a `BlobStoreError`.
public struct S3BlobStore: BlobStore {
    public struct Configuration: Sendable {
        /// The store's address: `https://s3.us-east-1.amazonaws.com`, `https://<account>.r2.cloudflarestorage.com`, `http://127.0.0.1:7480`.
        public var endpoint: URL
        public var region: String
        public var bucket: String
        /// Path-style addressing (`endpoint/bucket/key`, MinIO and Ceph's default) rather than
        /// virtual-host (`bucket.endpoint/key`, AWS's).
        public var pathStyle: Bool
        public var credentials: SigV4.Credentials
        /// A public or CDN base URL in front of the bucket: download links are `base/key`,
        /// unsigned. Nil: presigned GETs of the store itself.
        public var publicBaseURL: String?
        /// The store as the readers of this process's presigned URLs reach it, when not as the
        /// process does (`S3_PUBLIC_ENDPOINT`, `S3_WORKER_ENDPOINT`): the URLs name it, and are
        /// signed for its host. Nil: `endpoint`.
        public var presignEndpoint: URL?
        /// Attempts of one request on transport errors, 5xx and `SlowDown`.
        public var maxAttempts: Int
        /// Deadline of one attempt.
        public var timeout: Duration
        /// Deadline of a `HEAD` or `DELETE`, its attempts included: what a request's path waits
        /// on (an upload checked before its job is created). A store cut off from this process
        /// (a partition: no refusal, no answer) makes such a call fail as unavailable, the
        /// request 503, rather than hold it for the attempts' 2 minutes.
        public var controlTimeout: Duration

        public init(endpoint: URL, region: String, bucket: String, pathStyle: Bool, credentials: SigV4.Credentials,
                    publicBaseURL: String? = nil, presignEndpoint: URL? = nil, maxAttempts: Int = 4, timeout: Duration = .seconds(30),
                    controlTimeout: Duration = .seconds(5)) {
            self.endpoint = endpoint
            self.presignEndpoint = presignEndpoint
            self.region = region
            self.bucket = bucket
            self.pathStyle = pathStyle
            self.credentials = credentials
            self.publicBaseURL = publicBaseURL
            self.maxAttempts = maxAttempts
            self.timeout = timeout
            self.controlTimeout = controlTimeout
        }
    }

    public let configuration: Configuration
    let signer: SigV4
    let client: HTTPClient
    /// An endpoint's parts, read once (Foundation's URL is slow to ask): scheme, `Host` value
    /// (with a port that is not the scheme's), and path prefix.
    struct Address {
        let scheme: String
        let host: String
        let basePath: String

        init(_ endpoint: URL) {
            scheme = endpoint.scheme ?? "https"
            var host = endpoint.host ?? "localhost"
            if let port = endpoint.port, !(scheme == "http" && port == 80), !(scheme == "https" && port == 443) { host += ":\(port)" }
            self.host = host
            basePath = endpoint.path.hasSuffix("/") ? String(endpoint.path.dropLast()) : endpoint.path
        }
    }

    /// Where this process reaches the store, and where its presigned URLs' readers do.
    let own: Address
    let presigned: Address
    public var kind: BlobStoreKind { .s3 }

    init(configuration: Configuration, client: HTTPClient) {
        self.configuration = configuration
        self.signer = SigV4(credentials: configuration.credentials, region: configuration.region)
        self.client = client
        own = Address(configuration.endpoint)
        presigned = configuration.presignEndpoint.map(Address.init) ?? own
    }

    /// Opens the bucket: checks that the store answers and that the bucket exists and takes our
    /// credentials; an error says which is wrong.
    public static func open(_ configuration: Configuration, client: HTTPClient = .shared) async throws -> S3BlobStore {
        let store = S3BlobStore(configuration: configuration, client: client)
        let response = try await store.send("HEAD", key: nil)
        switch response.status.code {
        case 200..<300: return store
        case 404: throw BlobStoreError(.misconfigured, "bucket \(configuration.bucket) does not exist at \(configuration.endpoint.absoluteString)")
        case 301, 400, 403: throw BlobStoreError(.misconfigured, "\(configuration.endpoint.absoluteString) refused access to bucket \(configuration.bucket) (\(response.status.code)): check the credentials, region and addressing")
        default: throw BlobStoreError(.unavailable, "\(configuration.endpoint.absoluteString) answered \(response.status.code) for bucket \(configuration.bucket)")
        }
    }

    // MARK: BlobStore

    public func put(_ key: String, from source: BlobSource, metadata: BlobMetadata, ifAbsent: Bool) async throws {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        var headers = [("Content-Type", metadata.contentType)]
        if !metadata.owner.isEmpty, metadata.owner.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { headers.append(("x-amz-meta-owner", metadata.owner)) }
        if ifAbsent { headers.append(("If-None-Match", "*")) }
        let response = try await send("PUT", key: key, headers: headers, body: source)
        switch response.status.code {
        case 200..<300: return
        case 412 where ifAbsent: throw BlobError.exists
        case 409 where ifAbsent: throw BlobError.exists  // ConditionalRequestConflict: another write won
        default: throw try await failure(response, doing: "PUT \(key)")
        }
    }

    public func open(_ key: String, range: ClosedRange<Int>?) async throws -> BlobReader {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        var headers: [(String, String)] = []
        if let range { headers.append(("Range", "bytes=\(range.lowerBound)-\(range.upperBound)")) }
        let response = try await send("GET", key: key, headers: headers)
        switch response.status.code {
        case 200, 206:
            var metadata = Self.metadata(response.headers)
            let length = Int(response.headers.first(name: "Content-Length") ?? "") ?? 0
            var served: ClosedRange<Int>?
            if response.status.code == 206, let contentRange = response.headers.first(name: "Content-Range"),
               let parsed = Self.contentRange(contentRange) {
                served = parsed.range
                metadata.size = parsed.total
            } else {
                metadata.size = length
            }
            let iterator = BodyIterator(response.body.makeAsyncIterator())
            return BlobReader(metadata: metadata, range: served, length: length, body: BlobBody { try await iterator.next() })
        case 404, 416:
            throw BlobError.notFound
        default:
            throw try await failure(response, doing: "GET \(key)")
        }
    }

    public func head(_ key: String) async throws -> BlobMetadata? {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        let response = try await send("HEAD", key: key, within: configuration.controlTimeout)
        switch response.status.code {
        case 200..<300:
            var metadata = Self.metadata(response.headers)
            metadata.size = Int(response.headers.first(name: "Content-Length") ?? "") ?? 0
            return metadata
        case 404: return nil
        default: throw try await failure(response, doing: "HEAD \(key)")
        }
    }

    public func delete(_ key: String) async throws {
        guard BlobKey.isValid(key) else { throw BlobError.invalidKey }
        let response = try await send("DELETE", key: key, within: configuration.controlTimeout)
        guard (200..<300).contains(response.status.code) || response.status.code == 404 else {
            throw try await failure(response, doing: "DELETE \(key)")
        }
    }

    public func list(prefix: String, modifiedBefore date: Date, limit: Int) async throws -> [String] {
        var keys: [String] = []
        var token: String?
        repeat {
            var query = [("list-type", "2"), ("prefix", prefix), ("max-keys", "1000")]
            if let token { query.append(("continuation-token", token)) }
            let response = try await send("GET", key: nil, query: query)
            guard response.status.code == 200 else { throw try await failure(response, doing: "list \(prefix)") }
            let xml = String(buffer: try await response.body.collect(upTo: 8 << 20))
            for entry in Self.elements("Contents", in: xml) {
                guard let key = Self.elements("Key", in: entry).first, let modified = Self.elements("LastModified", in: entry).first.flatMap(Self.isoDate) else { continue }
                if modified < date, BlobKey.isValid(key) { keys.append(key) }
                if keys.count >= limit { return keys }
            }
            token = Self.elements("IsTruncated", in: xml).first == "true" ? Self.elements("NextContinuationToken", in: xml).first : nil
        } while token != nil
        return keys
    }

    public func presignedGET(_ key: String, expiresIn: Int, now: Date) -> String {
        if let base = configuration.publicBaseURL { return "\(base)/\(SigV4.uriEncode(key, keepSlash: true))" }
        let (url, host, path) = address(of: key, at: presigned)
        let query = signer.presignedQuery(SigV4.Request(method: "GET", path: path, headers: [("host", host)]), expires: Self.clamp(expiresIn), date: now)
        return "\(url)?\(SigV4.queryString(query))"
    }

    public func presignedPUT(_ key: String, contentType: String, owner: String, expiresIn: Int, now: Date) -> PresignedRequest {
        let (url, host, path) = address(of: key, at: presigned)
        // The content type is signed: the client must send it as it is, so the store enforces
        // it. `If-None-Match: *` is not: a client that sends it writes the key once (the store
        // answers 412 to a second PUT), one that does not can still upload (the app's own
        // client sends only `Content-Type`), and a job pins the version it was checked on.
        let headers = ["Content-Type": contentType]
        let signed = [("host", host)] + headers.map { ($0.key, $0.value) }
        let query = signer.presignedQuery(SigV4.Request(method: "PUT", path: path, headers: signed), expires: Self.clamp(expiresIn), date: now)
        return PresignedRequest(url: "\(url)?\(SigV4.queryString(query))", headers: headers)
    }

    // MARK: Requests

    /// The URL (without query), the `Host` value and the encoded path of `key` (the bucket
    /// itself when nil) at `address` (this process's own by default).
    func address(of key: String?, at address: Address? = nil) -> (url: String, host: String, path: String) {
        let address = address ?? own
        var host = address.host
        let encodedKey = key.map { "/" + SigV4.uriEncode($0, keepSlash: true) } ?? ""
        if configuration.pathStyle {
            let path = "\(address.basePath)/\(SigV4.uriEncode(configuration.bucket))\(encodedKey)"
            return ("\(address.scheme)://\(host)\(path)", host, path)
        }
        host = "\(configuration.bucket).\(host)"
        let path = address.basePath + (encodedKey.isEmpty ? "/" : encodedKey)
        return ("\(address.scheme)://\(host)\(path)", host, path)
    }

    /// Sends one signed request, retrying transport errors, 5xx and `SlowDown` with backoff, all
    /// within `limit` if given.
    func send(_ method: String, key: String?, query: [(String, String)] = [], headers: [(String, String)] = [], body: BlobSource? = nil,
              within limit: Duration? = nil) async throws -> HTTPClientResponse {
        let (url, host, path) = address(of: key)
        let deadline = limit.map { ContinuousClock.now.advanced(by: $0) }
        var attempt = 0
        while true {
            attempt += 1
            let pause = Self.backoff(attempt)
            var request = HTTPClientRequest(url: query.isEmpty ? url : "\(url)?\(SigV4.queryString(query))")
            request.method = HTTPMethod(rawValue: method)
            if let body { request.body = try await Self.payload(body) }
            // AsyncHTTPClient sends `Host` (from the URL) and `Content-Length` itself; `Host` is signed.
            let signed = signer.signedHeaders(for: SigV4.Request(method: method, path: path, query: query, headers: headers + [("host", host)]),
                                              payloadHash: SigV4.unsignedPayload, date: Date())
            for (name, value) in headers + signed { request.headers.add(name: name, value: value) }
            do {
                let left = deadline.map { ContinuousClock.now.duration(to: $0) } ?? configuration.timeout
                let response = try await client.execute(request, timeout: TimeAmount(min(configuration.timeout, max(left, .milliseconds(1)))))
                let code = response.status.code
                guard code >= 500 || code == 429 else { return response }
                if attempt >= configuration.maxAttempts || Self.past(deadline, after: pause) { return response }
                _ = try? await response.body.collect(upTo: 64 << 10)
            } catch {
                if attempt >= configuration.maxAttempts || Self.past(deadline, after: pause) {
                    throw BlobStoreError(.unavailable, "\(configuration.endpoint.absoluteString) could not be reached (\(Self.describe(error)))")
                }
            }
            try await Task.sleep(for: pause)
        }
    }

    /// Whether `deadline` would be past after waiting `wait` (no deadline: never).
    static func past(_ deadline: ContinuousClock.Instant?, after wait: Duration) -> Bool {
        deadline.map { ContinuousClock.now.advanced(by: wait) >= $0 } ?? false
    }

    /// Full jitter over 100 ms doubling, at most 2 s.
    static func backoff(_ attempt: Int) -> Duration {
        let cap = min(2_000, 100 << min(attempt - 1, 5))
        return .milliseconds(Int.random(in: cap / 2...cap))
    }

    static func payload(_ source: BlobSource) async throws -> HTTPClientRequest.Body {
        switch source {
        case .bytes(let buffer):
            return .bytes(buffer)
        case .file(let file):
            let (opened, size) = try await FolderBlobStore.blocking { () -> (OpenFile, Int) in
                let descriptor = Glibc.open(file.path, O_RDONLY | O_CLOEXEC)
                guard descriptor >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
                let opened = OpenFile(descriptor)
                var status = stat()
                guard fstat(descriptor, &status) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
                return (opened, Int(status.st_size))
            }
            let cursor = opened.cursor(from: 0, to: size)
            return .stream(BlobBody { try await cursor.next() }, length: .known(Int64(size)))
        }
    }

    /// The error of a final answer: the store's `<Code>` mapped to what the gateway tells the app.
    func failure(_ response: HTTPClientResponse, doing what: String) async throws -> BlobStoreError {
        let text = (try? await response.body.collect(upTo: 64 << 10)).map { String(buffer: $0) } ?? ""
        let code = Self.elements("Code", in: text).first ?? ""
        let status = response.status.code
        let said = "\(what) answered \(status)\(code.isEmpty ? "" : " \(code)")"
        switch (status, code) {
        case (_, "QuotaExceeded"), (_, "InsufficientStorage"), (507, _):
            return BlobStoreError(.full, said)
        case (403, _), (_, "NoSuchBucket"), (301, _), (400, "AuthorizationHeaderMalformed"):
            return BlobStoreError(.misconfigured, said)
        default:
            return BlobStoreError(.unavailable, said)
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? HTTPClientError { return error.shortDescription }
        return String(describing: type(of: error))
    }

    static func clamp(_ seconds: Int) -> Int { min(604_800, max(1, seconds)) }

    static func metadata(_ headers: HTTPHeaders) -> BlobMetadata {
        let modified = headers.first(name: "Last-Modified").flatMap(httpDate) ?? Date()
        return BlobMetadata(owner: headers.first(name: "x-amz-meta-owner") ?? "", contentType: headers.first(name: "Content-Type") ?? "application/octet-stream",
                            size: 0, createdAt: modified, etag: headers.first(name: "ETag"))
    }

    /// `bytes 0-9/443`.
    static func contentRange(_ value: String) -> (range: ClosedRange<Int>, total: Int)? {
        guard value.hasPrefix("bytes ") else { return nil }
        let parts = value.dropFirst(6).split(separator: "/")
        guard parts.count == 2, let total = Int(parts[1]) else { return nil }
        let bounds = parts[0].split(separator: "-")
        guard bounds.count == 2, let low = Int(bounds[0]), let high = Int(bounds[1]), low <= high else { return nil }
        return (low...high, total)
    }

    /// The texts of every `<name>...</name>` in `xml` (S3's answers are flat enough for this).
    static func elements(_ name: String, in xml: String) -> [String] {
        var found: [String] = []
        var rest = xml[...]
        while let open = rest.range(of: "<\(name)>"), let close = rest.range(of: "</\(name)>", range: open.upperBound..<rest.endIndex) {
            found.append(String(rest[open.upperBound..<close.lowerBound]))
            rest = rest[close.upperBound...]
        }
        return found
    }

    static func isoDate(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text) ?? ISO8601DateFormatter().date(from: text)
    }

    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: text)
    }
}

/// The iterator of a response body, advanced by the one task that reads the blob. A connection
/// that breaks mid-body (the store restarting) is the store being unavailable, as a failed request
/// is, not a transport error for every reader to know about (the gateway answered those 500).
final class BodyIterator: @unchecked Sendable {
    var base: HTTPClientResponse.Body.AsyncIterator
    init(_ base: HTTPClientResponse.Body.AsyncIterator) { self.base = base }
    func next() async throws -> ByteBuffer? {
        do {
            return try await base.next()
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw BlobStoreError(.unavailable, "the object store's answer broke off (\(error))")
        }
    }
}

extension S3BlobStore: CustomStringConvertible {
    /// The store's address and bucket: never its credentials (a service group logs its services).
    public var description: String { "S3BlobStore(\(configuration.endpoint.absoluteString), bucket \(configuration.bucket))" }
}
