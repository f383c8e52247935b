import Crypto
import Foundation
import SwiftASN1
// The time a chain is checked at is passed in (the verifier's rules depend on it, and its tests
// check a real attestation at the time it was made): swift-certificates' SPI for a fixed time.
@_spi(FixedExpiryValidationTime) import X509

/// Checks an App Attest attestation object (Apple's `DCAppAttestService.attestKey`) the way
/// Apple's "Validating apps that connect to your server" lists it, step by step:
/// 1. the `x5c` chain (credential certificate, then Apple's intermediate) verifies up to Apple's
///    App Attest root at `time`;
/// 2-4. the credential certificate's extension 1.2.840.113635.100.8.2 holds
///    SHA256(authData || SHA256(challenge));
/// 5. SHA256 of the certificate's public key (the uncompressed P-256 point) is the key id;
/// 6. the authenticator data's RP ID hash is SHA256 of the App ID (`TEAMID.bundle.id`);
/// 7. its counter is 0;
/// 8. its aaguid names the environment (`appattestdevelop`, or `appattest` and seven zero bytes);
/// 9. its credential id is the key id.
/// Time is passed in: a certificate's validity is a rule that depends on it.
public struct AppAttestVerifier: Sendable {
    public enum Environment: String, Sendable, CaseIterable {
        case production, development

        /// The authenticator data's aaguid for this environment.
        var aaguid: [UInt8] {
            switch self {
            case .production: Array("appattest".utf8) + [UInt8](repeating: 0, count: 7)
            case .development: Array("appattestdevelop".utf8)
            }
        }
    }

    /// The App ID the attestations must be for: the team id, a dot, the bundle id.
    public let appId: String
    public let environment: Environment
    private let root: Certificate

    public init(appId: String, environment: Environment, root: Certificate = AppAttestVerifier.appleRoot) {
        self.appId = appId
        self.environment = environment
        self.root = root
    }

    /// What a verified attestation proves: this key, made by a real install of the app.
    public struct AttestedKey: Sendable, Equatable {
        /// SHA256 of the key's public point: the app's key identifier.
        public let keyId: [UInt8]
        /// The key's public point (X9.63 uncompressed), for checking the app's later assertions.
        public let publicKey: [UInt8]
    }

    /// Verifies `attestation` (the CBOR object) for `keyId` (the app's 32-byte key identifier)
    /// and the `challenge` the server gave (whose SHA256 is the attestation's client data hash).
    public func verify(attestation: [UInt8], keyId: [UInt8], challenge: [UInt8], at time: Date) async throws(AppAttestError) -> AttestedKey {
        // The object: {fmt: "apple-appattest", attStmt: {x5c: [credCert, intermediate], receipt}, authData}
        guard attestation.count <= 64 << 10, let object = try? CBOR.decode(attestation) else { throw .malformed("not a CBOR attestation object") }
        guard object["fmt"]?.textString == "apple-appattest" else { throw .malformed("fmt is not apple-appattest") }
        guard let chain = object["attStmt"]?["x5c"]?.arrayItems?.compactMap(\.byteString), chain.count >= 2,
              let authData = object["authData"]?.byteString else {
            throw .malformed("attStmt.x5c or authData missing")
        }
        let certificates: [Certificate]
        do { certificates = try chain.map { try Certificate(derEncoded: $0) } } catch { throw .malformed("a certificate of x5c is not DER X.509") }
        let credential = certificates[0]

        // 1. The chain, to Apple's root, at `time`
        var verifier = Verifier(rootCertificates: CertificateStore([root])) { RFC5280Policy(fixedExpiryValidationTime: time) }
        guard case .validCertificate = await verifier.validate(leaf: credential, intermediates: CertificateStore(Array(certificates.dropFirst()))) else {
            throw .untrustedChain
        }

        // 2-4. The nonce: SHA256(authData || SHA256(challenge)), in the certificate's extension
        let nonce = Array(SHA256.hash(data: authData + Array(SHA256.hash(data: challenge))))
        guard let stated = Self.nonce(in: credential) else { throw .malformed("the credential certificate has no App Attest nonce") }
        guard stated == nonce else { throw .nonceMismatch }

        // 5. The key id is SHA256 of the certificate's public key
        guard let key = P256.Signing.PublicKey(credential.publicKey) else { throw .malformed("the credential key is not P-256") }
        let point = Array(key.x963Representation)
        guard Array(SHA256.hash(data: point)) == keyId else { throw .keyIdMismatch }

        // 6-9. The authenticator data: rpIdHash(32) flags(1) counter(4) aaguid(16) idLength(2) credentialId
        let data = try AuthenticatorData(authData)
        guard data.rpIdHash == Array(SHA256.hash(data: Array(appId.utf8))) else { throw .appIdMismatch }
        guard data.counter == 0 else { throw .counterNotZero }
        guard data.aaguid == environment.aaguid else { throw .environmentMismatch }
        guard data.credentialId == keyId else { throw .credentialIdMismatch }
        return AttestedKey(keyId: keyId, publicKey: point)
    }

    /// The octet string of the credential certificate's extension 1.2.840.113635.100.8.2: a
    /// SEQUENCE holding `[1] EXPLICIT OCTET STRING`.
    static func nonce(in certificate: Certificate) -> [UInt8]? {
        let oid: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 8, 2]
        guard let value = certificate.extensions.first(where: { $0.oid == oid })?.value,
              let sequence = try? DER.parse(value), sequence.identifier == .sequence,
              case .constructed(let items) = sequence.content,
              let tagged = items.first(where: { $0.identifier == ASN1Identifier(tagWithNumber: 1, tagClass: .contextSpecific) }),
              case .constructed(let inner) = tagged.content,
              let octets = inner.first(where: { _ in true }), octets.identifier == .octetString,
              case .primitive(let bytes) = octets.content else { return nil }
        return Array(bytes)
    }

    /// The fixed-layout head of WebAuthn authenticator data, as App Attest fills it.
    struct AuthenticatorData {
        let rpIdHash: [UInt8]
        let counter: UInt32
        let aaguid: [UInt8]
        let credentialId: [UInt8]

        init(_ bytes: [UInt8]) throws(AppAttestError) {
            guard bytes.count >= 55 else { throw .malformed("authenticator data too short") }
            rpIdHash = Array(bytes[0..<32])
            counter = bytes[33..<37].reduce(0) { $0 << 8 | UInt32($1) }
            aaguid = Array(bytes[37..<53])
            let length = Int(bytes[53]) << 8 | Int(bytes[54])
            guard bytes.count >= 55 + length else { throw .malformed("authenticator data's credential id cut short") }
            credentialId = Array(bytes[55..<(55 + length)])
        }
    }

    /// Apple's App Attest root certificate, "Apple App Attestation Root CA" (P-384, valid 2020 to
    /// 2045), from https://www.apple.com/certificateauthority/Apple_App_Attestation_Root_CA.pem;
    /// SHA-256 of its DER 1cb9823ba28ba6ad2d33a006941de2ae4f513ef1d4e831b9f7e0fa7b6242c932.
    public static let appleRoot = try! Certificate(pemEncoded: appleRootPEM)

    /// `appleRoot` as Apple publishes it.
    public static let appleRootPEM = """
            -----BEGIN CERTIFICATE-----
            MIICITCCAaegAwIBAgIQC/O+DvHN0uD7jG5yH2IXmDAKBggqhkjOPQQDAzBSMSYw
            JAYDVQQDDB1BcHBsZSBBcHAgQXR0ZXN0YXRpb24gUm9vdCBDQTETMBEGA1UECgwK
            QXBwbGUgSW5jLjETMBEGA1UECAwKQ2FsaWZvcm5pYTAeFw0yMDAzMTgxODMyNTNa
            Fw00NTAzMTUwMDAwMDBaMFIxJjAkBgNVBAMMHUFwcGxlIEFwcCBBdHRlc3RhdGlv
            biBSb290IENBMRMwEQYDVQQKDApBcHBsZSBJbmMuMRMwEQYDVQQIDApDYWxpZm9y
            bmlhMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAERTHhmLW07ATaFQIEVwTtT4dyctdh
            NbJhFs/Ii2FdCgAHGbpphY3+d8qjuDngIN3WVhQUBHAoMeQ/cLiP1sOUtgjqK9au
            Yen1mMEvRq9Sk3Jm5X8U62H+xTD3FE9TgS41o0IwQDAPBgNVHRMBAf8EBTADAQH/
            MB0GA1UdDgQWBBSskRBTM72+aEH/pwyp5frq5eWKoTAOBgNVHQ8BAf8EBAMCAQYw
            CgYIKoZIzj0EAwMDaAAwZQIwQgFGnByvsiVbpTKwSga0kP0e8EeDS4+sQmTvb7vn
            53O5+FRXgeLhpJ06ysC5PrOyAjEAp5U4xDgEgllF7En3VcE3iexZZtKeYnpqtijV
            oyFraWVIyd/dganmrduC1bmTBGwD
            -----END CERTIFICATE-----
            """
}

/// Why an attestation was refused; the description is safe to show the app.
public enum AppAttestError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case untrustedChain
    case nonceMismatch
    case keyIdMismatch
    case appIdMismatch
    case counterNotZero
    case environmentMismatch
    case credentialIdMismatch

    public var description: String {
        switch self {
        case .malformed(let what): "malformed attestation: \(what)"
        case .untrustedChain: "the certificate chain does not verify to Apple's App Attest root"
        case .nonceMismatch: "the attestation is not for this challenge"
        case .keyIdMismatch: "the key id is not the attested key's"
        case .appIdMismatch: "the attestation is for another app"
        case .counterNotZero: "the attestation's counter is not 0"
        case .environmentMismatch: "the attestation is from another App Attest environment"
        case .credentialIdMismatch: "the credential id is not the key id"
        }
    }
}
