import Crypto
import Foundation
import Synchronization

/// AWS Signature Version 4, written from AWS's documentation ("Signature Version 4 signing
/// process" and S3's "Authenticating Requests (AWS Signature Version 4)": header authentication
/// and query-string presigning). Checked against AWS's published SigV4 test suite and the S3
/// examples in `SigV4Tests`.
public struct SigV4: Sendable {
    /// An access key pair, with the session token of temporary credentials.
    public struct Credentials: Sendable {
        public var accessKeyId: String
        public var secretAccessKey: String
        public var sessionToken: String?

        public init(accessKeyId: String, secretAccessKey: String, sessionToken: String? = nil) {
            self.accessKeyId = accessKeyId
            self.secretAccessKey = secretAccessKey
            self.sessionToken = sessionToken
        }
    }

    /// One request to sign: the path as sent (already percent-encoded), its query as decoded
    /// name-value pairs, and its headers (names in any case).
    public struct Request: Sendable {
        public var method: String
        public var path: String
        public var query: [(String, String)]
        public var headers: [(String, String)]

        public init(method: String, path: String, query: [(String, String)] = [], headers: [(String, String)]) {
            self.method = method
            self.path = path
            self.query = query
            self.headers = headers
        }
    }

    /// The hash S3 accepts in place of a payload's SHA-256 when the body is not signed.
    public static let unsignedPayload = "UNSIGNED-PAYLOAD"
    /// SHA-256 of nothing: the payload hash of a request with no body.
    public static let emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

    public let credentials: Credentials
    public let region: String
    public let service: String
    /// The derived signing key of the last day used: four HMACs a request saved.
    private let dayKey = DayKey()

    final class DayKey: Sendable {
        let cached = Mutex<(day: String, key: SymmetricKey)?>(nil)
    }

    public init(credentials: Credentials, region: String, service: String = "s3") {
        self.credentials = credentials
        self.region = region
        self.service = service
    }

    // MARK: Header authentication

    /// The `Authorization` header value of `request`, whose headers must already hold `host`
    /// and `x-amz-date` (and `x-amz-security-token` with temporary credentials).
    public func authorization(_ request: Request, payloadHash: String, date: Date) -> String {
        let (signedHeaders, canonicalHeaders) = Self.canonicalHeaders(request.headers)
        let canonical = canonicalRequest(request, canonicalHeaders: canonicalHeaders, signedHeaders: signedHeaders, payloadHash: payloadHash)
        let signature = sign(canonical, date: date)
        return "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyId)/\(scope(date)), SignedHeaders=\(signedHeaders), Signature=\(signature)"
    }

    /// The headers to add to `request` for header authentication: `x-amz-date`,
    /// `x-amz-content-sha256` (S3 only), the session token, and `Authorization`.
    public func signedHeaders(for request: Request, payloadHash: String, date: Date) -> [(String, String)] {
        var added: [(String, String)] = [("x-amz-date", Self.timestamp(date))]
        if service == "s3" { added.append(("x-amz-content-sha256", payloadHash)) }
        if let token = credentials.sessionToken { added.append(("x-amz-security-token", token)) }
        var signed = request
        signed.headers += added
        added.append(("Authorization", authorization(signed, payloadHash: payloadHash, date: date)))
        return added
    }

    // MARK: Presigning

    /// The query of a presigned URL for `request` (its own query pairs first), valid for
    /// `expires` seconds from `date` (S3 takes 1 to 604,800). Every header of `request` is signed:
    /// the client must send each with the same value.
    public func presignedQuery(_ request: Request, expires: Int, date: Date, payloadHash: String = SigV4.unsignedPayload) -> [(String, String)] {
        let (signedHeaders, canonicalHeaders) = Self.canonicalHeaders(request.headers)
        var query = request.query
        query.append(("X-Amz-Algorithm", "AWS4-HMAC-SHA256"))
        query.append(("X-Amz-Credential", "\(credentials.accessKeyId)/\(scope(date))"))
        query.append(("X-Amz-Date", Self.timestamp(date)))
        query.append(("X-Amz-Expires", String(expires)))
        if let token = credentials.sessionToken { query.append(("X-Amz-Security-Token", token)) }
        query.append(("X-Amz-SignedHeaders", signedHeaders))
        var unsigned = request
        unsigned.query = query
        let canonical = canonicalRequest(unsigned, canonicalHeaders: canonicalHeaders, signedHeaders: signedHeaders, payloadHash: payloadHash)
        query.append(("X-Amz-Signature", sign(canonical, date: date)))
        return query
    }

    /// A query as it goes on a URL: pairs encoded as SigV4 encodes them, in the given order.
    public static func queryString(_ query: [(String, String)]) -> String {
        query.map { "\(uriEncode($0.0))=\(uriEncode($0.1))" }.joined(separator: "&")
    }

    // MARK: The steps

    /// Task 1: the canonical request.
    func canonicalRequest(_ request: Request, canonicalHeaders: String, signedHeaders: String, payloadHash: String) -> String {
        let encoded: [(name: String, value: String)] = request.query.map { (Self.uriEncode($0.0), Self.uriEncode($0.1)) }
        let sorted = encoded.sorted { left, right in left.name == right.name ? left.value < right.value : left.name < right.name }
        let query = sorted.map { "\($0.name)=\($0.value)" }.joined(separator: "&")
        let path = request.path.isEmpty ? "/" : request.path
        return [request.method, path, query, canonicalHeaders, signedHeaders, payloadHash].joined(separator: "\n")
    }

    /// Task 2 and 3: the string to sign, and its signature with the derived key.
    func sign(_ canonicalRequest: String, date: Date) -> String {
        let stringToSign = [
            "AWS4-HMAC-SHA256", Self.timestamp(date), scope(date), Self.hex(SHA256.hash(data: Data(canonicalRequest.utf8))),
        ].joined(separator: "\n")
        return Self.hex(HMAC<SHA256>.authenticationCode(for: Data(stringToSign.utf8), using: signingKey(date)))
    }

    func signingKey(_ date: Date) -> SymmetricKey {
        let today = Self.day(date)
        if let cached = dayKey.cached.withLock({ $0 }), cached.day == today { return cached.key }
        let day = Self.hmac(SymmetricKey(data: Data("AWS4\(credentials.secretAccessKey)".utf8)), today)
        let regional = Self.hmac(day, region)
        let service = Self.hmac(regional, self.service)
        let key = Self.hmac(service, "aws4_request")
        dayKey.cached.withLock { $0 = (today, key) }
        return key
    }

    func scope(_ date: Date) -> String { "\(Self.day(date))/\(region)/\(service)/aws4_request" }

    /// Lower-case names, sorted; values trimmed with inner runs of spaces made one; repeated
    /// names joined with commas.
    static func canonicalHeaders(_ headers: [(String, String)]) -> (signed: String, canonical: String) {
        var merged: [String: [String]] = [:]
        for (name, value) in headers {
            let trimmed = value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
            merged[name.lowercased(), default: []].append(trimmed)
        }
        let names = merged.keys.sorted()
        let canonical = names.map { "\($0):\(merged[$0]!.joined(separator: ","))\n" }.joined()
        return (names.joined(separator: ";"), canonical)
    }

    /// Percent-encodes every byte but the unreserved `A-Z a-z 0-9 - _ . ~`; with
    /// `keepSlash`, `/` too (an object key in a path).
    public static func uriEncode(_ text: String, keepSlash: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count + 16)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.append(byte)
            case UInt8(ascii: "/") where keepSlash:
                out.append(byte)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(upperHexDigits[Int(byte >> 4)])
                out.append(upperHexDigits[Int(byte & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func hmac(_ key: SymmetricKey, _ text: String) -> SymmetricKey {
        SymmetricKey(data: Data(HMAC<SHA256>.authenticationCode(for: Data(text.utf8), using: key)))
    }

    static let upperHexDigits = Array("0123456789ABCDEF".utf8)
    static let lowerHexDigits = Array("0123456789abcdef".utf8)

    /// Lower-case hex of `bytes`.
    public static func hex<D: Sequence>(_ bytes: D) -> String where D.Element == UInt8 {
        var digits: [UInt8] = []
        digits.reserveCapacity(64)
        for byte in bytes {
            digits.append(lowerHexDigits[Int(byte >> 4)])
            digits.append(lowerHexDigits[Int(byte & 0x0F)])
        }
        return String(decoding: digits, as: UTF8.self)
    }

    /// The hex SHA-256 of `bytes`: a signed payload's hash.
    public static func payloadHash<D: DataProtocol>(_ bytes: D) -> String { hex(SHA256.hash(data: bytes)) }

    /// `YYYYMMDD'T'HHMMSS'Z'` in UTC.
    public static func timestamp(_ date: Date) -> String {
        let seconds = Int(date.timeIntervalSince1970.rounded(.down))
        let (days, second) = (seconds.floorDivided(by: 86_400), seconds - seconds.floorDivided(by: 86_400) * 86_400)
        // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
        let z = days + 719_468
        let era = z.floorDivided(by: 146_097)
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthPrime = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthPrime + 2) / 5 + 1
        let month = monthPrime < 10 ? monthPrime + 3 : monthPrime - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(year)\(two(month))\(two(day))T\(two(second / 3600))\(two(second % 3600 / 60))\(two(second % 60))Z"
    }

    static func day(_ date: Date) -> String { String(timestamp(date).prefix(8)) }
}

extension Int {
    /// The quotient rounded toward minus infinity.
    func floorDivided(by divisor: Int) -> Int {
        let quotient = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? quotient - 1 : quotient
    }
}

extension SigV4.Credentials: CustomStringConvertible {
    /// Names the access key id only: a secret never reaches a log line.
    public var description: String { "Credentials(\(accessKeyId))" }
}

extension SigV4: CustomStringConvertible {
    public var description: String { "SigV4(\(service), \(region), \(credentials))" }
}
