import Foundation

/// The jobs service's methods for the devices that hear of a user's jobs by push notification.
public enum Devices {
    /// Registers a device's push token for the user (a token another user had moves to this one:
    /// the token names the app on a device, and whoever signs in there now is who it belongs to).
    public static let put = BusMethod<DeviceRegistration, DeviceRecord>("jobs.device-put", roles: [.gateway], retrySafe: true)
    /// Removes a device's token, if it is the user's (else `not_found`).
    public static let delete = BusMethod<DeviceReference, Empty>("jobs.device-delete", roles: [.gateway], retrySafe: true)

    /// The most devices a user has: registering another forgets the one registered longest ago.
    public static let maxPerUser = 20
    /// The longest token taken (APNs' are 64 hex digits, FCM's about 160 characters).
    public static let maxTokenLength = 512
}

/// Which push service a token is for.
public enum PushPlatform: String, Codable, Sendable, CaseIterable {
    /// Apple's APNs (an iOS app).
    case apns
    /// Firebase Cloud Messaging (an Android app).
    case fcm

    /// The platform a client names: `apns` or `ios`, `fcm` or `android`.
    public init?(client value: String) {
        switch value.lowercased() {
        case "apns", "ios": self = .apns
        case "fcm", "android": self = .fcm
        default: return nil
        }
    }
}

/// Which of APNs' two servers a token belongs to: `production` (App Store and TestFlight builds)
/// or `sandbox` (development builds, run from Xcode).
public enum PushEnvironment: String, Codable, Sendable, CaseIterable {
    case production, sandbox
}

/// A device's token, registered for a user.
public struct DeviceRegistration: Codable, Sendable, Equatable {
    public var userId: String
    public var token: String
    public var platform: PushPlatform
    public var environment: PushEnvironment
    public init(userId: String, token: String, platform: PushPlatform, environment: PushEnvironment = .production) {
        self.userId = userId
        self.token = token
        self.platform = platform
        self.environment = environment
    }

    /// Whether `token` is one a push service could have issued: 1 to `maxTokenLength` characters
    /// of letters, digits and `-_:.` (APNs' hex, FCM's base64url with `:`).
    public static func isValid(token: String) -> Bool {
        !token.isEmpty && token.utf8.count <= Devices.maxTokenLength
            && token.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                     UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: ":"), UInt8(ascii: "."): true
                default: false
                }
            }
    }
}

/// A registered device, as the app reads it back.
public struct DeviceRecord: Codable, Sendable, Equatable {
    public var token: String
    public var platform: PushPlatform
    public var environment: PushEnvironment
    public var registeredAt: Date
    public init(token: String, platform: PushPlatform, environment: PushEnvironment, registeredAt: Date) {
        self.token = token
        self.platform = platform
        self.environment = environment
        self.registeredAt = registeredAt
    }
}

/// Names a device's token on behalf of a user.
public struct DeviceReference: Codable, Sendable, Equatable {
    public var userId: String
    public var token: String
    public init(userId: String, token: String) {
        self.userId = userId
        self.token = token
    }
}

/// One push notification to send: a job of the user ended (completed or failed), for one of
/// their devices. Written to the jobs outbox in the transaction that ended the job.
public struct PushNotice: Codable, Sendable, Equatable {
    public var userId: String
    public var token: String
    public var platform: PushPlatform
    public var environment: PushEnvironment
    public var jobId: String
    public var status: JobStatus
    public init(userId: String, token: String, platform: PushPlatform, environment: PushEnvironment, jobId: String, status: JobStatus) {
        self.userId = userId
        self.token = token
        self.platform = platform
        self.environment = environment
        self.jobId = jobId
        self.status = status
    }
}
