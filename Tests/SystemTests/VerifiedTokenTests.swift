import Foundation
@testable import GatewayApp
import HTTPTypes
import Hummingbird
import JWTKit
import NIOCore
import Synchronization
import Testing

@Suite("Verified tokens", .timeLimit(.minutes(5)))
struct VerifiedTokenTests {
    static let secret = "verified-token-secret-\(UUID().uuidString)"

    func request(bearer token: String) -> Request {
        Request(
            head: HTTPRequest(method: .get, scheme: "http", authority: "localhost", path: "/api/v1/users/me", headerFields: [.authorization: "Bearer \(token)"]),
            body: .init(buffer: ByteBuffer())
        )
    }

    /// `Authorization: Bearer <token>`: the scheme in any case (RFC 9110 §11.1), spaces before
    /// the token; anything else is no bearer token (a 401).
    @Test func theBearerSchemeIsReadInAnyCaseAndNothingElseIs() {
        #expect(Authenticator.bearerToken(in: "Bearer abc.def") == "abc.def")
        #expect(Authenticator.bearerToken(in: "bearer abc") == "abc")
        #expect(Authenticator.bearerToken(in: "BeArEr   abc") == "abc")
        for refused in ["Bearer", "Bearer ", "Bearer   ", "Bearerabc", "Basic dXNlcjpwYXNz", "Bear abc", "Bearér abc", "", " Bearer abc"] {
            #expect(Authenticator.bearerToken(in: refused) == nil, "\(refused)")
        }
    }

    /// Two `Authorization` fields are refused, even when the first alone would pass.
    @Test func twoAuthorizationFieldsAreRefused() async throws {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: Self.secret), digestAlgorithm: .sha256)
        let token = try await keys.sign(TestClaims(sub: .init(value: "user-1"), exp: .init(value: Date().addingTimeInterval(3600)), email: nil))
        let authenticator = try await Authenticator(jwtSecret: Self.secret, adminToken: nil)
        _ = try await authenticator.caller(of: request(bearer: token))
        var fields: HTTPFields = [.authorization: "Bearer \(token)"]
        fields.append(HTTPField(name: .authorization, value: "Bearer \(token)"))
        let twice = Request(
            head: HTTPRequest(method: .get, scheme: "http", authority: "localhost", path: "/api/v1/users/me", headerFields: fields),
            body: .init(buffer: ByteBuffer())
        )
        await #expect(throws: Problem.self) { try await authenticator.caller(of: twice) }
    }

    @Test func aVerifiedTokenIsRememberedUntilItExpiresAndNoLonger() async throws {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: Self.secret), digestAlgorithm: .sha256)
        let expiry = Date().addingTimeInterval(3600)
        let token = try await keys.sign(TestClaims(sub: .init(value: "user-1"), exp: .init(value: expiry), email: "a@example.com"))
        let clock = Mutex(Date())
        let authenticator = try await Authenticator(jwtSecret: Self.secret, adminToken: nil, now: { clock.withLock { $0 } })

        // Verified, then answered from memory, the same caller each time
        let first = try await authenticator.caller(of: request(bearer: token))
        let second = try await authenticator.caller(of: request(bearer: token))
        #expect(first.id == "user-1" && first.email == "a@example.com")
        #expect(second == first)
        // A token differing only in its signature is not the remembered one
        let tampered = String(token.dropLast(2)) + (token.hasSuffix("AA") ? "BB" : "AA")
        await #expect(throws: (any Error).self) { try await authenticator.caller(of: request(bearer: tampered)) }
        // Past its expiry the remembered token is refused
        clock.withLock { $0 = expiry.addingTimeInterval(1) }
        await #expect(throws: (any Error).self) { try await authenticator.caller(of: request(bearer: token)) }
    }
}
