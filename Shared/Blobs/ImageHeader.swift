/// An image's width and height read from its header alone, without decoding a pixel: how the
/// gateway refuses an image bomb (a small file that decodes to billions of pixels) at upload.
public struct ImageSize: Sendable, Equatable, CustomStringConvertible {
    public var width: Int
    public var height: Int

    public init(width: Int, height: Int) {
        self.width = width
        self.height = height
    }

    public var pixels: Int { width.multipliedReportingOverflow(by: height).overflow ? .max : width * height }
    public var description: String { "\(width)x\(height)" }

    /// The size stated by the header in `bytes` (the file's start: 256 KiB holds every header
    /// seen in practice) of a JPEG, PNG, WebP or HEIC image; nil if it cannot be read there.
    public static func read(_ bytes: [UInt8], contentType: String) -> ImageSize? {
        switch contentType {
        case "image/png": png(bytes)
        case "image/jpeg": jpeg(bytes)
        case "image/webp": webp(bytes)
        case "image/heic": heic(bytes)
        default: nil
        }
    }

    static func be(_ bytes: [UInt8], _ at: Int, _ count: Int) -> Int? {
        guard at >= 0, at + count <= bytes.count else { return nil }
        return bytes[at..<(at + count)].reduce(0) { $0 << 8 | Int($1) }
    }

    static func le(_ bytes: [UInt8], _ at: Int, _ count: Int) -> Int? {
        guard at >= 0, at + count <= bytes.count else { return nil }
        return bytes[at..<(at + count)].reversed().reduce(0) { $0 << 8 | Int($1) }
    }

    /// PNG: the IHDR chunk comes first, width and height as 32-bit big-endian numbers.
    static func png(_ bytes: [UInt8]) -> ImageSize? {
        guard bytes.count >= 24, Array(bytes[12..<16]) == Array("IHDR".utf8),
              let width = be(bytes, 16, 4), let height = be(bytes, 20, 4) else { return nil }
        return ImageSize(width: width, height: height)
    }

    /// JPEG: walks the marker segments to the first start-of-frame (SOF0 to SOF15 but DHT,
    /// JPG and DAC), which holds height then width.
    static func jpeg(_ bytes: [UInt8]) -> ImageSize? {
        var at = 2
        while at + 4 <= bytes.count {
            guard bytes[at] == 0xFF else { return nil }
            let marker = bytes[at + 1]
            if marker == 0xFF { at += 1; continue }  // fill byte
            if marker == 0xD8 || marker == 0x01 || (0xD0...0xD7).contains(marker) { at += 2; continue }
            guard marker != 0xD9, marker != 0xDA, let length = be(bytes, at + 2, 2), length >= 2 else { return nil }
            if (0xC0...0xCF).contains(marker), marker != 0xC4, marker != 0xC8, marker != 0xCC {
                guard let height = be(bytes, at + 5, 2), let width = be(bytes, at + 7, 2) else { return nil }
                return ImageSize(width: width, height: height)
            }
            at += 2 + length
        }
        return nil
    }

    /// WebP: lossy (`VP8 `), lossless (`VP8L`) or extended (`VP8X`, the canvas size).
    static func webp(_ bytes: [UInt8]) -> ImageSize? {
        guard bytes.count >= 30 else { return nil }
        switch String(decoding: bytes[12..<16], as: UTF8.self) {
        case "VP8 ":
            guard bytes[23] == 0x9D, bytes[24] == 0x01, bytes[25] == 0x2A,
                  let width = le(bytes, 26, 2), let height = le(bytes, 28, 2) else { return nil }
            return ImageSize(width: width & 0x3FFF, height: height & 0x3FFF)
        case "VP8L":
            guard bytes[20] == 0x2F, let bits = le(bytes, 21, 4) else { return nil }
            return ImageSize(width: (bits & 0x3FFF) + 1, height: ((bits >> 14) & 0x3FFF) + 1)
        case "VP8X":
            guard let width = le(bytes, 24, 3), let height = le(bytes, 27, 3) else { return nil }
            return ImageSize(width: width + 1, height: height + 1)
        default:
            return nil
        }
    }

    /// HEIC: the largest `ispe` (image spatial extents) property, which for a gridded image is
    /// the whole picture rather than one of its tiles.
    static func heic(_ bytes: [UInt8]) -> ImageSize? {
        let ispe = Array("ispe".utf8)
        var best: ImageSize?
        var at = 4
        while at + 16 <= bytes.count {
            if bytes[at] == ispe[0], Array(bytes[at..<(at + 4)]) == ispe,
               let width = be(bytes, at + 8, 4), let height = be(bytes, at + 12, 4) {
                let size = ImageSize(width: width, height: height)
                if size.pixels > (best?.pixels ?? -1) { best = size }
                at += 16
            } else {
                at += 1
            }
        }
        return best
    }
}
