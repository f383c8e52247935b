import Foundation
import Messages
import ServiceKit

/// Push notifications when a job ends, per platform, each on when its variables are set:
/// - APNs (Apple's provider API over HTTP/2, token authentication): `APNS_KEY_ID`, `APNS_TEAM_ID`,
///   `APNS_TOPIC` (the app's bundle id) and `APNS_KEY_FILE` (the `.p8` signing key from Apple's
///   developer account), all four or none; `APNS_URL` and `APNS_SANDBOX_URL` name the servers
///   (Apple's by default).
/// - FCM (Firebase Cloud Messaging's HTTP v1 API): `FCM_SERVICE_ACCOUNT_FILE`, the service
///   account's JSON key from the Firebase console (its `project_id`, `client_email`,
///   `private_key` and `token_uri` are used); `FCM_URL` names the server (Google's by default).
/// - `PUSH_CA_FILE`: a PEM of certificate authorities to trust besides the system's (a TLS
///   proxy on the way out, or a test server).
///
/// The keys are read once at start; they appear in no log, error or description.
public struct PushSettings: Sendable, CustomStringConvertible {
    public struct APNs: Sendable {
        public var keyId: String
        public var teamId: String
        public var topic: String
        /// The `.p8` key's PEM text (secret).
        var keyPEM: String
        public var productionURL: String
        public var sandboxURL: String
    }

    public struct FCM: Sendable {
        public var projectId: String
        public var clientEmail: String
        /// The service account's private key, PEM (secret).
        var privateKeyPEM: String
        public var tokenURI: String
        public var baseURL: String
    }

    public var apns: APNs?
    public var fcm: FCM?
    public var caFile: String?

    /// The platforms configured (none: push is off).
    public var platforms: [PushPlatform] { (apns == nil ? [] : [.apns]) + (fcm == nil ? [] : [.fcm]) }

    public var description: String {
        platforms.isEmpty ? "push off" : "push on " + platforms.map(\.rawValue).joined(separator: ", ")
    }

    public static let environmentKeys = [
        "APNS_KEY_ID", "APNS_TEAM_ID", "APNS_TOPIC", "APNS_KEY_FILE", "APNS_URL", "APNS_SANDBOX_URL", "FCM_SERVICE_ACCOUNT_FILE", "FCM_URL",
        "PUSH_CA_FILE",
    ]

    public init(apns: APNs? = nil, fcm: FCM? = nil, caFile: String? = nil) {
        self.apns = apns
        self.fcm = fcm
        self.caFile = caFile
    }

    public init(environment: Environment) throws {
        let productionURL = environment.string("APNS_URL", default: "https://api.push.apple.com")
        let sandboxURL = environment.string("APNS_SANDBOX_URL", default: "https://api.sandbox.push.apple.com")
        let fcmURL = environment.string("FCM_URL", default: "https://fcm.googleapis.com")
        let apnsKeys = ["APNS_KEY_ID", "APNS_TEAM_ID", "APNS_TOPIC", "APNS_KEY_FILE"]
        let given = apnsKeys.filter { environment.optional($0) != nil }
        if !given.isEmpty {
            guard given.count == apnsKeys.count else {
                let missing = apnsKeys.filter { !given.contains($0) }
                throw ConfigurationError(key: missing[0], value: "", expected: "set with \(given.joined(separator: ", ")): APNs needs all of \(apnsKeys.joined(separator: ", "))")
            }
            let file = environment.optional("APNS_KEY_FILE")!
            guard let pem = try? String(contentsOfFile: file, encoding: .utf8), pem.contains("-----BEGIN PRIVATE KEY-----") else {
                throw ConfigurationError(key: "APNS_KEY_FILE", value: file, expected: "a readable .p8 file (a PEM private key) from Apple's developer account")
            }
            apns = APNs(
                keyId: environment.optional("APNS_KEY_ID")!, teamId: environment.optional("APNS_TEAM_ID")!, topic: environment.optional("APNS_TOPIC")!,
                keyPEM: pem, productionURL: productionURL, sandboxURL: sandboxURL
            )
        }
        if let file = environment.optional("FCM_SERVICE_ACCOUNT_FILE") {
            struct Account: Decodable {
                var project_id: String
                var client_email: String
                var private_key: String
                var token_uri: String?
            }
            guard let data = FileManager.default.contents(atPath: file), let account = try? JSONDecoder().decode(Account.self, from: data) else {
                throw ConfigurationError(key: "FCM_SERVICE_ACCOUNT_FILE", value: file,
                                         expected: "a readable service account JSON key with project_id, client_email and private_key")
            }
            fcm = FCM(
                projectId: account.project_id, clientEmail: account.client_email, privateKeyPEM: account.private_key,
                tokenURI: account.token_uri ?? "https://oauth2.googleapis.com/token",
                baseURL: fcmURL
            )
        }
        caFile = environment.optional("PUSH_CA_FILE")
    }
}
