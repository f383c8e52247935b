import AppAttest
import Crypto
import Foundation
import Testing
import X509

/// The verifier against a real attestation made by an iPhone (iOS 14.2, App Attest's development
/// environment), published by Vincent Haupert's open-source verifier as a test sample:
/// github.com/veehaitch/devicecheck-appattest, `src/test/resources/iOS14-attestation-sample.json`
/// at commit aabfb4b2fd38ddf254295afad86c40d864565885 (copied unchanged into `Fixtures/`). Its
/// credential certificate is valid for three days from 2020-11-21, so the checks run at a time
/// inside them, passed in.
@Suite("App Attest verifier", .timeLimit(.minutes(5)))
struct AppAttestVerifierTests {
    struct Sample: Decodable {
        let attestationBase64: String
        let clientDataBase64: String
        let clientDataHashSha256Base64: String
        let keyIdBase64: String
        let teamIdentifier: String
        let bundleIdentifier: String
        let timestamp: String

        var attestation: [UInt8] { Array(Data(base64Encoded: attestationBase64)!) }
        var challenge: [UInt8] { Array(Data(base64Encoded: clientDataBase64)!) }
        var keyId: [UInt8] { Array(Data(base64Encoded: keyIdBase64)!) }
        var appId: String { "\(teamIdentifier).\(bundleIdentifier)" }
        /// When the app made it: the certificate is valid then.
        var madeAt: Date { try! Date(timestamp, strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true)) }
    }

    static let sample: Sample = {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/iOS14-attestation-sample.json")
        return try! JSONDecoder().decode(Sample.self, from: Data(contentsOf: file))
    }()

    var sample: Sample { Self.sample }
    var verifier: AppAttestVerifier { AppAttestVerifier(appId: sample.appId, environment: .development) }

    @Test func theRootIsApplesAppAttestRoot() {
        let body = AppAttestVerifier.appleRootPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let digest = SHA256.hash(data: Data(base64Encoded: body)!).map { String(format: "%02x", $0) }.joined()
        #expect(digest == "1cb9823ba28ba6ad2d33a006941de2ae4f513ef1d4e831b9f7e0fa7b6242c932")
    }

    @Test func theSampleVerifies() async throws {
        // The sample's own client data hash is SHA256 of its challenge, as the verifier computes it
        #expect(Array(SHA256.hash(data: sample.challenge)) == Array(Data(base64Encoded: sample.clientDataHashSha256Base64)!))
        let key = try await verifier.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        #expect(key.keyId == sample.keyId)
        #expect(key.publicKey.count == 65 && key.publicKey[0] == 4)
        #expect(Array(SHA256.hash(data: key.publicKey)) == sample.keyId)
    }

    @Test func anotherAppIdIsRefused() async {
        let other = AppAttestVerifier(appId: "6MURL8TA57.com.example.other", environment: .development)
        await #expect(throws: AppAttestError.appIdMismatch) {
            try await other.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func theProductionEnvironmentRefusesADevelopmentAttestation() async {
        let production = AppAttestVerifier(appId: sample.appId, environment: .production)
        await #expect(throws: AppAttestError.environmentMismatch) {
            try await production.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func anotherChallengeIsRefused() async {
        await #expect(throws: AppAttestError.nonceMismatch) {
            try await verifier.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: Array("another challenge".utf8), at: sample.madeAt)
        }
    }

    @Test func anotherKeyIdIsRefused() async {
        var keyId = sample.keyId
        keyId[0] ^= 1
        await #expect(throws: AppAttestError.keyIdMismatch) {
            try await verifier.verify(attestation: sample.attestation, keyId: keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func anExpiredCertificateIsRefused() async {
        await #expect(throws: AppAttestError.untrustedChain) {
            try await verifier.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt.addingTimeInterval(30 * 86_400))
        }
    }

    @Test func aTamperedAuthenticatorDataIsRefused() async throws {
        // The counter of authData (its bytes 33-36) set to 1: the nonce no longer matches
        let tampered = try Self.replacingAuthData(in: sample.attestation) { data in data[36] = 1 }
        await #expect(throws: AppAttestError.nonceMismatch) {
            try await verifier.verify(attestation: tampered, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func aTamperedCertificateIsRefused() async throws {
        // One byte inside the credential certificate's signature changed: the chain does not verify
        var bytes = sample.attestation
        let certificate = try #require(Self.range(of: Self.firstCertificate(sample.attestation), in: bytes))
        bytes[certificate.upperBound - 5] ^= 0x01
        await #expect(throws: AppAttestError.untrustedChain) {
            try await verifier.verify(attestation: bytes, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func aChainToAnImpostorRootIsRefused() async throws {
        // A root of our own with Apple's root's name: every signature in the sample's chain is
        // right, but none was made by this root's key.
        let key = P384.Signing.PrivateKey()
        let name = try DistinguishedName {
            CommonName("Apple App Attestation Root CA")
            OrganizationName("Apple Inc.")
            StateOrProvinceName("California")
        }
        let impostor = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: Date(timeIntervalSince1970: 0), notValidAfter: Date(timeIntervalSince1970: 4_000_000_000),
            issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA384,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true))
            },
            issuerPrivateKey: .init(key)
        )
        let fooled = AppAttestVerifier(appId: sample.appId, environment: .development, root: impostor)
        await #expect(throws: AppAttestError.untrustedChain) {
            try await fooled.verify(attestation: sample.attestation, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
        }
    }

    @Test func garbageIsMalformedNeverACrash() async {
        var inputs: [[UInt8]] = [[], [0xA3], [0xBF, 0xFF], Array("not cbor at all".utf8), [0x5B, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]]
        // Every prefix of the real object, and nested arrays deeper than the decoder takes
        inputs += stride(from: 0, to: sample.attestation.count, by: 97).map { Array(sample.attestation.prefix($0)) }
        inputs.append([UInt8](repeating: 0x81, count: 10_000) + [0x00])
        for input in inputs {
            await #expect(throws: AppAttestError.self) {
                try await verifier.verify(attestation: input, keyId: sample.keyId, challenge: sample.challenge, at: sample.madeAt)
            }
        }
    }

    @Test func theDecoderReadsWhatItIsGiven() throws {
        // RFC 8949 Appendix A examples
        #expect(try CBOR.decode([0x18, 0x64]) == .unsigned(100))
        #expect(try CBOR.decode([0x38, 0x63]) == .negative(99))
        #expect(try CBOR.decode([0x43, 0x01, 0x02, 0x03]) == .bytes([1, 2, 3]))
        #expect(try CBOR.decode([0x64, 0x49, 0x45, 0x54, 0x46]) == .text("IETF"))
        #expect(try CBOR.decode([0x83, 0x01, 0x82, 0x02, 0x03, 0x82, 0x04, 0x05]) == .array([.unsigned(1), .array([.unsigned(2), .unsigned(3)]), .array([.unsigned(4), .unsigned(5)])]))
        #expect(try CBOR.decode([0xA2, 0x61, 0x61, 0x01, 0x61, 0x62, 0x82, 0x02, 0x03])["b"] == .array([.unsigned(2), .unsigned(3)]))
        #expect(try CBOR.decode([0xF5]) == .simple(21))
        #expect(throws: CBOR.DecodingError.trailingBytes) { try CBOR.decode([0x01, 0x02]) }
        #expect(throws: CBOR.DecodingError.truncated) { try CBOR.decode([0x9B, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]) }
        #expect(throws: CBOR.DecodingError.invalidText) { try CBOR.decode([0x62, 0xC3, 0x28]) }
    }

    // MARK: Helpers

    static func firstCertificate(_ attestation: [UInt8]) -> [UInt8] {
        (try? CBOR.decode(attestation))?["attStmt"]?["x5c"]?.arrayItems?.first?.byteString ?? []
    }

    static func range(of needle: [UInt8], in haystack: [UInt8]) -> Range<Int>? {
        guard !needle.isEmpty, needle.count <= haystack.count else { return nil }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] && Array(haystack[start..<(start + needle.count)]) == needle {
            return start..<(start + needle.count)
        }
        return nil
    }

    /// The attestation with its authData changed in place (same length, so the CBOR head holds).
    static func replacingAuthData(in attestation: [UInt8], _ change: (inout [UInt8]) -> Void) throws -> [UInt8] {
        let authData = try #require(try CBOR.decode(attestation)["authData"]?.byteString)
        let found = try #require(Self.range(of: authData, in: attestation))
        var changed = authData
        change(&changed)
        var bytes = attestation
        bytes.replaceSubrange(found, with: changed)
        return bytes
    }
}
