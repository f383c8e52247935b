import Foundation
import HistoryCore
import Messages
import Testing

@Suite("Signed tokens", .timeLimit(.minutes(5)))
struct TokenTests {
    @Test func base64URLRoundTripsEveryByteWithoutPlusSlashOrPadding() throws {
        for length in 0..<40 {
            let bytes = Data((0..<length).map { UInt8(truncatingIfNeeded: $0 * 37 + 250) })
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("+") && !text.contains("/") && !text.contains("="))
            #expect(Base64URL.decode(text) == bytes)
        }
        #expect(Base64URL.decode("a+b/") == nil)
        #expect(Base64URL.decode("!!!") == nil)
        // RFC 4648 §10's test vectors, unpadded, and the two characters base64url changes
        let vectors = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE", "foobar": "Zm9vYmFy"]
        for (plain, encoded) in vectors { #expect(Base64URL.encode(Data(plain.utf8)) == encoded, "\(plain)") }
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
    }

    @Test func aTokenOpensOnlyForItsKindUserAndScope() {
        let signer = TokenSigner(key: Array(repeating: 7, count: 32))
        let token = PageCursor(createdAt: 1_700_000_000_123, jobId: "job-1").seal(with: signer, userId: "u1", scope: "completed|sun")
        #expect(PageCursor.open(token, with: signer, userId: "u1", scope: "completed|sun") == PageCursor(createdAt: 1_700_000_000_123, jobId: "job-1"))
        #expect(PageCursor.open(token, with: signer, userId: "u2", scope: "completed|sun") == nil)
        #expect(PageCursor.open(token, with: signer, userId: "u1", scope: "|sun") == nil)
        #expect(ChangesToken.open(token, with: signer, userId: "u1") == nil)
        #expect(PageCursor.open(token, with: TokenSigner(key: Array(repeating: 8, count: 32)), userId: "u1", scope: "completed|sun") == nil)
    }
}
