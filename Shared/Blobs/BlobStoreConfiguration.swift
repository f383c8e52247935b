import AsyncHTTPClient
import Foundation
import Messages

/// Which blob store a process uses and how to reach it, from the environment:
/// `BLOB_STORE=folder` (the default: `BLOB_DIR`, served through the gateway's signed routes at
/// `PUBLIC_BASE_URL`, signed with `URL_SIGNING_SECRET`) or `BLOB_STORE=s3` (`S3_ENDPOINT`,
/// `S3_REGION`, `S3_BUCKET`, `S3_ADDRESSING`, `S3_PUBLIC_BASE_URL`, and the standard
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
///
/// **Addresses per audience.** The URLs a process hands out name the store as their readers
/// reach it, which need not be how the process itself does, nor how the other audience does:
/// phones reach a public name, GPU hosts perhaps a private one. The gateway hands URLs to apps
/// (`PUBLIC_BASE_URL`, `S3_PUBLIC_ENDPOINT`), jobs to workers (`WORKER_BASE_URL`,
/// `S3_WORKER_ENDPOINT`); each defaults to the one address there is (`PUBLIC_BASE_URL`,
/// `S3_ENDPOINT`).
public struct BlobStoreConfiguration: Sendable {
    /// Who reads the URLs this process signs.
    public enum Audience: Sendable { case apps, workers }

    public enum Store: Sendable {
        case folder(URL)
        case s3(S3BlobStore.Configuration)
    }

    public var store: Store
    /// For the folder store's signed routes.
    public var urlSigningSecret: String
    /// The gateway as apps and providers reach it (`PUBLIC_BASE_URL`): share links, webhooks.
    public var publicBaseURL: String
    /// The gateway as this process's audience reaches it: the base of the folder store's signed
    /// URLs (`WORKER_BASE_URL` for jobs' workers; `publicBaseURL` for apps).
    public var presignBaseURL: String

    public init(store: Store, urlSigningSecret: String, publicBaseURL: String, presignBaseURL: String? = nil) {
        self.store = store
        self.urlSigningSecret = urlSigningSecret
        self.publicBaseURL = publicBaseURL
        self.presignBaseURL = presignBaseURL ?? publicBaseURL
    }

    /// The variables `init(environment:audience:)` reads.
    public static func environmentKeys(for audience: Audience) -> [String] {
        [
            "BLOB_STORE", "BLOB_DIR", "DATA_DIR", "URL_SIGNING_SECRET", "PUBLIC_BASE_URL", "GATEWAY_HOST", "GATEWAY_PORT", "S3_ENDPOINT", "S3_REGION", "S3_BUCKET",
            "S3_ADDRESSING", "S3_PUBLIC_BASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
        ] + (audience == .workers ? ["WORKER_BASE_URL", "S3_WORKER_ENDPOINT"] : ["S3_PUBLIC_ENDPOINT"])
    }

    /// Reads the variables; a missing or malformed one is an error naming it (never its value
    /// when it is a secret).
    public init(environment: [String: String], audience: Audience = .apps) throws {
        try self.init(audience: audience) { key in environment[key].flatMap { $0.isEmpty ? nil : $0 } }
    }

    /// Reads the variables through `value` (unset and empty alike nil): a process's `Environment`
    /// passes its own lookup, so that its list of variables is checked against what this reads.
    public init(audience: Audience = .apps, value: (String) -> String?) throws {
        urlSigningSecret = value("URL_SIGNING_SECRET") ?? SharedDefaults.urlSigningSecret
        // Unset: the gateway's own default, from where it listens (as the gateway derives it).
        publicBaseURL = try value("PUBLIC_BASE_URL") ?? SharedDefaults.publicBaseURL(
            host: value("GATEWAY_HOST") ?? SharedDefaults.gatewayHost,
            port: value("GATEWAY_PORT").map { text in
                guard let port = Int(text) else { throw BlobStoreError(.misconfigured, "GATEWAY_PORT=\(text) is not a number") }
                return port
            } ?? SharedDefaults.gatewayPort
        ).url
        presignBaseURL = audience == .workers ? value("WORKER_BASE_URL") ?? publicBaseURL : publicBaseURL
        switch value("BLOB_STORE") ?? "folder" {
        case "folder", "disk":
            store = .folder(URL(fileURLWithPath: value("BLOB_DIR") ?? ((value("DATA_DIR") ?? SharedDefaults.dataDirectory) + "/blobs")))
        case "s3":
            guard let bucket = value("S3_BUCKET") else { throw BlobStoreError(.misconfigured, "BLOB_STORE=s3 needs S3_BUCKET") }
            guard let accessKey = value("AWS_ACCESS_KEY_ID"), let secret = value("AWS_SECRET_ACCESS_KEY") else {
                throw BlobStoreError(.misconfigured, "BLOB_STORE=s3 needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
            }
            let region = value("S3_REGION") ?? value("AWS_REGION") ?? "us-east-1"
            /// `text`, the value of `variable`, as an http(s) URL with a host.
            func httpURL(_ variable: String, _ text: String) throws -> URL {
                guard let url = URL(string: text), let scheme = url.scheme, ["http", "https"].contains(scheme), url.host != nil else {
                    throw BlobStoreError(.misconfigured, "\(variable)=\(text) is not an http(s) URL")
                }
                return url
            }
            let endpoint = try httpURL("S3_ENDPOINT", value("S3_ENDPOINT") ?? "https://s3.\(region).amazonaws.com")
            let presignVariable = audience == .workers ? "S3_WORKER_ENDPOINT" : "S3_PUBLIC_ENDPOINT"
            let presignEndpoint = try value(presignVariable).map { try httpURL(presignVariable, $0) }
            let addressing = value("S3_ADDRESSING") ?? (value("S3_ENDPOINT") == nil ? "virtual" : "path")
            guard ["path", "virtual"].contains(addressing) else {
                throw BlobStoreError(.misconfigured, "S3_ADDRESSING=\(addressing) is not path or virtual")
            }
            store = .s3(S3BlobStore.Configuration(
                endpoint: endpoint, region: region, bucket: bucket, pathStyle: addressing == "path",
                credentials: SigV4.Credentials(accessKeyId: accessKey, secretAccessKey: secret, sessionToken: value("AWS_SESSION_TOKEN")),
                publicBaseURL: value("S3_PUBLIC_BASE_URL").map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 },
                presignEndpoint: presignEndpoint
            ))
        case let other:
            throw BlobStoreError(.misconfigured, "BLOB_STORE=\(other) is not folder or s3")
        }
    }

    /// Opens the store: the folder made and writable, or the bucket answering to our
    /// credentials. A store that cannot be opened is an error that says why, in one line.
    public func open() async throws -> any BlobStore {
        switch store {
        case .folder(let root):
            do {
                return try await FolderBlobStore.open(root: root, signer: URLSigner(secret: urlSigningSecret), publicBaseURL: presignBaseURL)
            } catch {
                throw BlobStoreError(.misconfigured, "the blob folder \(root.path) cannot be used: \(error.localizedDescription)")
            }
        case .s3(let configuration):
            return try await S3BlobStore.open(configuration)
        }
    }
}
