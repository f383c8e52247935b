import Blobs
import Foundation
import Testing

/// AWS Signature Version 4 against AWS's published vectors: the "Signature Version 4 Test Suite"
/// (formerly in the AWS General Reference; `aws-sig-v4-test-suite`, each case's `.req` and
/// `.authz`), and the S3 examples of "Authenticating Requests: Using the Authorization Header"
/// and "... Using Query Parameters" in the S3 API reference.
@Suite(.timeLimit(.minutes(5)))
struct SigV4Tests {
    /// The test suite's credentials, region, service and time (20150830T123600Z).
    static let suite = SigV4(
        credentials: .init(accessKeyId: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        region: "us-east-1", service: "service"
    )
    static let suiteDate = Date(timeIntervalSince1970: 1_440_938_160)
    static let host = ("Host", "example.amazonaws.com")
    static let amzDate = ("X-Amz-Date", "20150830T123600Z")

    static func signature(_ authorization: String) -> String {
        String(authorization.split(separator: "=").last ?? "")
    }

    @Test func getVanillaQueryOrderKeySortsRepeatedNamesByValue() {
        let request = SigV4.Request(method: "GET", path: "/", query: [("Param1", "value2"), ("Param1", "Value1")], headers: [Self.host, Self.amzDate])
        #expect(Self.suite.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.suiteDate)
            == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1")
    }

    @Test func getVanillaEmptyQueryKey() {
        let request = SigV4.Request(method: "GET", path: "/", query: [("Param1", "value1")], headers: [Self.host, Self.amzDate])
        #expect(Self.signature(Self.suite.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.suiteDate))
            == "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb")
    }

    @Test func getUnreservedCharactersAreNotEncoded() {
        let request = SigV4.Request(method: "GET", path: "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", headers: [Self.host, Self.amzDate])
        #expect(Self.signature(Self.suite.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.suiteDate))
            == "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f")
    }

    @Test func postHeaderKeySortSignsHeadersInLowerCaseOrder() {
        let request = SigV4.Request(method: "POST", path: "/", headers: [Self.host, ("My-Header1", "value1"), Self.amzDate])
        #expect(Self.suite.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.suiteDate)
            == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c")
    }

    @Test func postFormBodyIsHashedIntoTheSignature() {
        let request = SigV4.Request(method: "POST", path: "/", headers: [("Content-Type", "application/x-www-form-urlencoded"), Self.host, Self.amzDate])
        #expect(Self.signature(Self.suite.authorization(request, payloadHash: SigV4.payloadHash(Data("Param1=value1".utf8)), date: Self.suiteDate))
            == "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a")
    }

    @Test func postWithSessionTokenSignedBefore() {
        let token = "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="
        let request = SigV4.Request(method: "POST", path: "/", headers: [Self.host, Self.amzDate, ("X-Amz-Security-Token", token)])
        #expect(Self.signature(Self.suite.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.suiteDate))
            == "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead")
    }

    // MARK: S3's own examples (bucket `examplebucket`, 20130524T000000Z)

    static let s3 = SigV4(credentials: .init(accessKeyId: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"), region: "us-east-1")
    static let s3Date = Date(timeIntervalSince1970: 1_369_353_600)

    @Test func s3GetObjectWithRangeHeaderAuthentication() {
        let request = SigV4.Request(method: "GET", path: "/test.txt", headers: [
            ("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9"),
            ("x-amz-content-sha256", SigV4.emptyPayloadHash), ("x-amz-date", "20130524T000000Z"),
        ])
        #expect(Self.s3.authorization(request, payloadHash: SigV4.emptyPayloadHash, date: Self.s3Date)
            == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    }

    @Test func s3PresignedGetForADay() {
        let query = Self.s3.presignedQuery(SigV4.Request(method: "GET", path: "/test.txt", headers: [("host", "examplebucket.s3.amazonaws.com")]),
                                           expires: 86_400, date: Self.s3Date)
        #expect(SigV4.queryString(query) == "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")
    }

    @Test func signedHeadersAddDateHashTokenAndAuthorization() {
        let signer = SigV4(credentials: .init(accessKeyId: "AKID", secretAccessKey: "secret", sessionToken: "token"), region: "auto")
        let added = signer.signedHeaders(for: SigV4.Request(method: "HEAD", path: "/b/k", headers: [("host", "h")]), payloadHash: SigV4.unsignedPayload, date: Self.s3Date)
        #expect(added.map(\.0) == ["x-amz-date", "x-amz-content-sha256", "x-amz-security-token", "Authorization"])
        #expect(added.last?.1.contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,") == true)
        #expect(!"\(signer)".contains("secret"))
    }

    @Test func uriEncodingKeepsSlashesOnlyInPaths() {
        #expect(SigV4.uriEncode("a b/c+d~") == "a%20b%2Fc%2Bd~")
        #expect(SigV4.uriEncode("uploads/ab/x.jpg", keepSlash: true) == "uploads/ab/x.jpg")
        #expect(SigV4.uriEncode("é") == "%C3%A9")
    }

    @Test func timestampsAreUTCCalendarTimesAcrossLeapYearsAndCenturies() {
        let formatter = ISO8601DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        var generator = SystemRandomNumberGenerator()
        let dates = [0.0, 951_782_400, 951_868_799, 1_709_164_800, 4_107_542_399] + (0..<2000).map { _ in Double(UInt32.random(in: 0...UInt32.max, using: &generator)) }
        for seconds in dates {
            let date = Date(timeIntervalSince1970: seconds)
            let expected = formatter.string(from: date).replacingOccurrences(of: "-", with: "").replacingOccurrences(of: ":", with: "")
            #expect(SigV4.timestamp(date) == expected, "\(seconds)")
        }
    }
}
