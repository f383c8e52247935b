import Crypto
import Foundation
import Messages

/// Opaque tokens (page cursors, changes tokens) that only this service can mint: the values and
/// an HMAC-SHA256 over them, the user and the query they belong to. A tampered token, or one
/// issued to another user or for another query, does not open.
public struct TokenSigner: Sendable {
    private let key: SymmetricKey

    public init(key: [UInt8]) { self.key = SymmetricKey(data: key) }

    /// `v1.<values, base64url>.<mac, base64url>`; values may not contain a newline.
    public func seal(_ values: [String], kind: String, userId: String, scope: String) -> String {
        let body = values.joined(separator: "\n")
        return "v1." + Base64URL.encode(Data(body.utf8)) + "." + Base64URL.encode(mac(body, kind: kind, userId: userId, scope: scope))
    }

    /// The values of a token this signer sealed for the same kind, user and scope; nil otherwise.
    public func open(_ token: String, kind: String, userId: String, scope: String) -> [String]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard token.utf8.count <= 1024, parts.count == 3, parts[0] == "v1",
              let bodyData = Base64URL.decode(parts[1]), let given = Base64URL.decode(parts[2])
        else { return nil }
        let body = String(decoding: bodyData, as: UTF8.self)
        let expected = mac(body, kind: kind, userId: userId, scope: scope)
        guard expected.count == given.count, zip(expected, given).reduce(UInt8(0), { $0 | ($1.0 ^ $1.1) }) == 0 else { return nil }
        return body.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    private func mac(_ body: String, kind: String, userId: String, scope: String) -> Data {
        let message = [kind, userId, scope, body].joined(separator: "\u{0}")
        return Data(HMAC<SHA256>.authenticationCode(for: Data(message.utf8), using: key))
    }
}

/// A keyset position in a user's history: the last item of a page, by (createdAt, job id).
public struct PageCursor: Sendable, Equatable {
    /// Milliseconds since 1970.
    public var createdAt: Int64
    public var jobId: String

    public init(createdAt: Int64, jobId: String) {
        self.createdAt = createdAt
        self.jobId = jobId
    }

    /// The cursor as an opaque token bound to the user and the query (`scope`).
    public func seal(with signer: TokenSigner, userId: String, scope: String) -> String {
        signer.seal([String(createdAt), jobId], kind: "cursor", userId: userId, scope: scope)
    }

    /// The cursor in `token`, nil if it is not one of this signer's for the user and query.
    public static func open(_ token: String, with signer: TokenSigner, userId: String, scope: String) -> PageCursor? {
        guard let values = signer.open(token, kind: "cursor", userId: userId, scope: scope), values.count == 2,
              let createdAt = Int64(values[0]), !values[1].isEmpty
        else { return nil }
        return PageCursor(createdAt: createdAt, jobId: values[1])
    }
}

/// A position in a user's changes feed.
public struct ChangesToken: Sendable, Equatable {
    public var sequence: Int64

    public init(sequence: Int64) { self.sequence = sequence }

    public func seal(with signer: TokenSigner, userId: String) -> String {
        signer.seal([String(sequence)], kind: "changes", userId: userId, scope: "")
    }

    public static func open(_ token: String, with signer: TokenSigner, userId: String) -> ChangesToken? {
        guard let values = signer.open(token, kind: "changes", userId: userId, scope: ""), values.count == 1,
              let sequence = Int64(values[0]), sequence >= 0
        else { return nil }
        return ChangesToken(sequence: sequence)
    }
}
