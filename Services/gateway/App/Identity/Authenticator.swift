import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import JWTKit
import ServiceKit
import Synchronization

/// Tells who a request comes from: `Authorization: Bearer <JWT HS256>` for a user, else
/// `X-Device-Id: <uuid>` for a guest; admin routes take `Authorization: Bearer <ADMIN_TOKEN>`.
/// Anything missing, malformed, expired or badly signed is a 401 problem.
public struct Authenticator: Sendable {
    private let keys: JWTKeyCollection?
    private let adminToken: [UInt8]?
    private let viewerToken: [UInt8]?
    private let verified = VerifiedTokens()
    private let now: @Sendable () -> Date

    /// The shortest HS256 secret accepted: as long as the hash (RFC 7518, section 3.2).
    public static let minimumSecretBytes = 32

    /// Verifies user tokens with `jwtSecret` (none: every bearer token is refused) and admin calls
    /// with `adminToken` (none: every admin call is refused). A secret shorter than 32 bytes is a
    /// configuration error.
    public init(jwtSecret: String?, adminToken: String?, viewerToken: String? = nil, now: @escaping @Sendable () -> Date = Date.init) async throws {
        self.now = now
        if let jwtSecret, !jwtSecret.isEmpty {
            guard jwtSecret.utf8.count >= Self.minimumSecretBytes else {
                throw ConfigurationError(key: "JWT_SECRET", value: "(\(jwtSecret.utf8.count) bytes)", expected: "at least \(Self.minimumSecretBytes) bytes")
            }
            let keys = JWTKeyCollection()
            await keys.add(hmac: HMACKey(from: jwtSecret), digestAlgorithm: .sha256)
            self.keys = keys
        } else {
            self.keys = nil
        }
        self.adminToken = adminToken.flatMap { $0.isEmpty ? nil : Array($0.utf8) }
        self.viewerToken = viewerToken.flatMap { $0.isEmpty ? nil : Array($0.utf8) }
    }

    /// The caller of `request`.
    public func caller(of request: Request) async throws -> Caller {
        if let token = try bearerToken(request) {
            guard let keys else { throw Self.unauthorized("Bearer tokens are not accepted by this server.") }
            guard token.utf8.count <= 8192 else { throw Self.unauthorized("The bearer token is too long.") }
            let now = now()
            if let caller = verified.caller(for: token, at: now) { return caller }
            do {
                let claims = try await keys.verify(token, as: UserClaims.self)
                let subject = claims.sub.value
                guard (1...256).contains(subject.utf8.count), !subject.hasPrefix("device:") else {
                    throw Self.unauthorized("The token's subject is not a usable user id.")
                }
                // JWTKit checked `exp` against the system clock; this is the clock we are given.
                guard now < claims.exp.value else { throw Self.unauthorized("The bearer token is invalid or expired.") }
                let caller = Caller(id: subject, email: claims.email)
                verified.remember(token, as: caller, until: claims.exp.value, now: now)
                return caller
            } catch let problem as Problem {
                throw problem
            } catch {
                throw Self.unauthorized("The bearer token is invalid or expired.")
            }
        }
        if let device = request.headers[.deviceId] {
            guard let uuid = UUID(uuidString: device) else {
                throw Self.unauthorized("X-Device-Id must be a UUID.")
            }
            return Caller(id: "device:\(uuid.uuidString.lowercased())", isGuest: true)
        }
        throw Self.unauthorized("Send Authorization: Bearer <token>, or X-Device-Id for a guest.")
    }

    /// Checks that `request` carries the admin token: 401 without credentials, 403 with others.
    public func requireAdmin(_ request: Request) throws {
        guard try requireOperator(request) == .admin else {
            throw Problem(.forbidden, detail: "This action needs the admin token; the viewer token only reads.")
        }
    }

    /// Who may read the admin routes: the admin token (`ADMIN_TOKEN`), which may also act, or the
    /// viewer token (`VIEWER_TOKEN`), which may only read.
    public enum OperatorRole: String, Sendable {
        case admin, viewer
    }

    /// The operator calling an admin route that reads: admin or viewer; anyone else is refused.
    @discardableResult
    public func requireOperator(_ request: Request) throws -> OperatorRole {
        guard let token = try bearerToken(request) else {
            throw Self.unauthorized("Admin routes take Authorization: Bearer <admin token>.")
        }
        let bytes = Array(token.utf8)
        if let adminToken, Self.constantTimeEqual(bytes, adminToken) { return .admin }
        if let viewerToken, Self.constantTimeEqual(bytes, viewerToken) { return .viewer }
        throw Problem(.forbidden, detail: "This route needs the admin or viewer token.")
    }

    private func bearerToken(_ request: Request) throws -> String? {
        // The fields themselves: `headers[.authorization]` joins every value it finds into a new
        // string. Two `Authorization` fields are no single bearer token.
        var found: String?
        for field in request.headers where field.name == .authorization {
            guard found == nil else { throw Self.unauthorized("Send one Authorization field.") }
            found = field.value
        }
        guard let header = found else { return nil }
        guard let token = Self.bearerToken(in: header) else {
            throw Self.unauthorized("Authorization must be 'Bearer <token>'.")
        }
        return token
    }

    /// The token of `Bearer <token>` (the scheme in any case, one or more spaces before the
    /// token, which runs to the end); nil for any other header. Read from the bytes: splitting
    /// and lowercasing made three strings of every authenticated request (1% of the machine in
    /// `bench-gateway`'s `users/me`).
    static func bearerToken(in header: String) -> String? {
        var header = header
        return header.withUTF8 { bytes -> String? in
            let scheme: StaticString = "bearer"
            guard bytes.count > scheme.utf8CodeUnitCount + 1, bytes[scheme.utf8CodeUnitCount] == UInt8(ascii: " ") else { return nil }
            for index in 0..<scheme.utf8CodeUnitCount where bytes[index] | 0x20 != scheme.utf8Start[index] { return nil }
            var start = scheme.utf8CodeUnitCount + 1
            while start < bytes.count, bytes[start] == UInt8(ascii: " ") { start += 1 }
            guard start < bytes.count else { return nil }
            return String(decoding: UnsafeBufferPointer(rebasing: bytes[start...]), as: UTF8.self)
        }
    }

    /// Whether two secrets are equal, in time that tells nothing of either.
    static func constantTimeEqual(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
        // Compare digests so neither the length nor the contents leak through timing.
        let left = SHA256.hash(data: lhs), right = SHA256.hash(data: rhs)
        return zip(left, right).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }

    static func unauthorized(_ detail: String) -> Problem {
        Problem(.unauthorized, detail: detail, headers: [.wwwAuthenticate: "Bearer"])
    }
}

extension HTTPField.Name {
    /// `X-Device-Id`: a guest's device UUID.
    public static let deviceId = HTTPField.Name("X-Device-Id")!
}

/// Tokens already verified, with the caller each names, until the token expires: an app sends
/// the same token with every request, and verifying it (parse, HMAC, JSON) on each one is the
/// largest cost of a small authenticated request after the bus call. Only tokens that verified
/// are kept, by their whole text (signature included), so no other string can match one. At
/// most `capacity` tokens; past it the cache starts over.
final class VerifiedTokens: Sendable {
    private let capacity: Int
    private let entries = Mutex<[String: (caller: Caller, expiresAt: Date)]>([:])

    init(capacity: Int = 10_000) { self.capacity = capacity }

    func caller(for token: String, at now: Date) -> Caller? {
        guard let entry = entries.withLock({ $0[token] }), now < entry.expiresAt else { return nil }
        return entry.caller
    }

    func remember(_ token: String, as caller: Caller, until expiresAt: Date, now: Date) {
        guard now < expiresAt else { return }
        entries.withLock { entries in
            if entries.count >= capacity { entries.removeAll(keepingCapacity: true) }
            entries[token] = (caller, expiresAt)
        }
    }
}
