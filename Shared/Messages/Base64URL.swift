import Foundation

/// The URL-safe base64 of RFC 4648 §5 without padding, for signatures and tokens that travel in
/// URLs: byte by byte, since Foundation's string replacement costs more than the HMAC it encodes.
public enum Base64URL {
    /// `bytes` in base64url, unpadded.
    public static func encode(_ bytes: some DataProtocol) -> String {
        let standard = Data(bytes).base64EncodedData()
        var out = [UInt8]()
        out.reserveCapacity(standard.count)
        for byte in standard {
            switch byte {
            case UInt8(ascii: "+"): out.append(UInt8(ascii: "-"))
            case UInt8(ascii: "/"): out.append(UInt8(ascii: "_"))
            case UInt8(ascii: "="): continue
            default: out.append(byte)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of base64url `text` (padded or not); nil if it is not base64url.
    public static func decode(_ text: some StringProtocol) -> Data? {
        var standard = [UInt8]()
        standard.reserveCapacity(text.utf8.count + 3)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "-"): standard.append(UInt8(ascii: "+"))
            case UInt8(ascii: "_"): standard.append(UInt8(ascii: "/"))
            case UInt8(ascii: "+"), UInt8(ascii: "/"): return nil
            default: standard.append(byte)
            }
        }
        while standard.count % 4 != 0 { standard.append(UInt8(ascii: "=")) }
        return Data(base64Encoded: Data(standard))
    }
}
