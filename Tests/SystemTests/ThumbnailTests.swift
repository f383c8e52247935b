import Foundation
import Blobs
import ImageOps
import Testing
@testable import WorkerKit

/// Thumbnails: a plain JPEG's is made with libjpeg alone (`imageops_thumbnail_jpeg`), every other
/// image's with libvips; both must give the same picture, EXIF orientation included.
@Suite("Thumbnails", .timeLimit(.minutes(5)))
struct ThumbnailTests {
    static let photo = try! Data(contentsOf: JobSystem.fixture)
    static let small = try! Data(contentsOf: JobSystem.fixture.deletingLastPathComponent().appendingPathComponent("small.jpg"))

    init() { _ = imageops_start("tests", 1) }

    /// The libjpeg path's thumbnail, or nil where it leaves the image to libvips.
    func quick(_ image: Data, size: Int32 = 200) -> Data? {
        var out: UnsafeMutableRawPointer?
        var length = 0
        let rc = image.withUnsafeBytes { imageops_thumbnail_jpeg($0.baseAddress, $0.count, size, &out, &length) }
        defer { imageops_free(out) }
        guard rc == 0, let out else { return nil }
        return Data(bytes: out, count: length)
    }

    func vips(_ image: Data) throws -> Data {
        try made { out, length, error in
            image.withUnsafeBytes { imageops_thumbnail_buffer_vips($0.baseAddress, $0.count, 200, &out, &length, &error, error.count) }
        }
    }

    /// What the workers call: either path.
    func thumbnail(_ image: Data) throws -> Data {
        try made { out, length, error in
            image.withUnsafeBytes { imageops_thumbnail_buffer($0.baseAddress, $0.count, 200, &out, &length, &error, error.count) }
        }
    }

    func made(_ call: (inout UnsafeMutableRawPointer?, inout Int, inout [CChar]) -> Int32) throws -> Data {
        var out: UnsafeMutableRawPointer?
        var length = 0
        var error = [CChar](repeating: 0, count: 512)
        let rc = call(&out, &length, &error)
        defer { imageops_free(out) }
        guard rc == 0, let out else { throw Failure(error) }
        return Data(bytes: out, count: length)
    }

    struct Failure: Error {
        let message: String
        init(_ error: [CChar]) { message = String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }

    func difference(_ a: Data, _ b: Data) throws -> Double {
        var difference = 0.0
        var error = [CChar](repeating: 0, count: 512)
        let rc = a.withUnsafeBytes { a in b.withUnsafeBytes { b in imageops_mean_difference(a.baseAddress, a.count, b.baseAddress, b.count, &difference, &error, error.count) } }
        guard rc == 0 else { throw Failure(error) }
        return difference
    }

    func size(_ image: Data) -> (Int, Int) {
        var width: Int32 = 0, height: Int32 = 0
        var error = [CChar](repeating: 0, count: 512)
        let rc = image.withUnsafeBytes { imageops_probe_buffer($0.baseAddress, $0.count, &width, &height, &error, error.count) }
        return rc == 0 ? (Int(width), Int(height)) : (0, 0)
    }

    /// The photo with its EXIF orientation tag (IFD0, 0x0112) set to `orientation`.
    static func oriented(_ orientation: UInt16) throws -> Data {
        var bytes = [UInt8](photo)
        let big: [UInt8] = [0x01, 0x12, 0x00, 0x03], little: [UInt8] = [0x12, 0x01, 0x03, 0x00]
        for index in 0..<(bytes.count - 12) {
            if Array(bytes[index..<index + 4]) == big {
                bytes[index + 8] = UInt8(orientation >> 8)
                bytes[index + 9] = UInt8(orientation & 0xFF)
                return Data(bytes)
            }
            if Array(bytes[index..<index + 4]) == little {
                bytes[index + 8] = UInt8(orientation & 0xFF)
                bytes[index + 9] = UInt8(orientation >> 8)
                return Data(bytes)
            }
        }
        Issue.record("the fixture photo has no orientation tag")
        return photo
    }

    @Test func aPlainJPEGsThumbnailFromLibjpegIsLibvipsOwnPicture() throws {
        let made = try #require(quick(Self.photo), "a plain 640x480 JPEG takes the libjpeg path")
        #expect(size(made) == (200, 200))
        // Both average the centre square down (libvips with Lanczos 3, here the exact area of
        // each pixel) and encode at quality 75: the same picture to within a few levels.
        #expect(try difference(made, vips(Self.photo)) < 3)
        #expect(try thumbnail(Self.photo) == made)
    }

    @Test(arguments: 1...8)
    func theEXIFOrientationTurnsTheThumbnailAsLibvipsTurnsIt(orientation: Int) throws {
        let image = try Self.oriented(UInt16(orientation))
        let made = try #require(quick(image))
        #expect(try difference(made, vips(image)) < 3, "orientation \(orientation)")
        if orientation != 1 {
            // The photo is not symmetric, so a turn or a flip shows.
            #expect(try difference(made, #require(quick(Self.photo))) > 10, "orientation \(orientation)")
        }
    }

    @Test func largeAndGrayscaleJPEGsTakeTheLibjpegPathToo() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("thumbnails-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let input = folder.appendingPathComponent("photo.jpg")
        try Self.photo.write(to: input)
        var error = [CChar](repeating: 0, count: 512)
        // 4,000 x 3,000: decoded at 1/8 of its size before it is averaged.
        let large = folder.appendingPathComponent("large.jpg"), gray = folder.appendingPathComponent("gray.jpg")
        #expect(imageops_apply(input.path, large.path, "upscale", 6.25, &error, error.count) == 0)
        #expect(imageops_apply(input.path, gray.path, "grayscale", 0, &error, error.count) == 0)
        for file in [large, gray] {
            let image = try Data(contentsOf: file)
            let made = try #require(quick(image), "\(file.lastPathComponent)")
            #expect(size(made) == (200, 200))
            #expect(try difference(made, vips(image)) < 3, "\(file.lastPathComponent)")
        }
        // Portrait and landscape images, not multiples of the blocks: the rows above the square
        // are skipped, and its columns cropped from inside a block (517x301 is decoded at 6/8,
        // 388x226, in blocks of 12 columns: the square starts 9 columns into one). Drawn as PPMs
        // in gradients, steep across (a crop shifted by a column shows), made JPEGs by libvips.
        for (width, height) in [(301, 517), (517, 301)] {
            var ppm = [UInt8]("P6\n\(width) \(height)\n255\n".utf8)
            for y in 0..<height {
                for x in 0..<width { ppm += [UInt8(abs(x % 100 - 50) * 5), UInt8(y * 255 / height), UInt8((x + 2 * y) * 255 / (width + 2 * height))] }
            }
            let image = try made { out, length, error in
                ppm.withUnsafeBytes { imageops_jpeg_buffer($0.baseAddress, $0.count, &out, &length, &error, error.count) }
            }
            #expect(size(image) == (width, height))
            let made = try #require(quick(image), "\(width)x\(height)")
            let difference = try difference(made, vips(image))
            #expect(difference < 3, "\(width)x\(height): \(difference)")
        }
        // The file path takes it as well.
        let written = folder.appendingPathComponent("thumbnail.jpg")
        #expect(imageops_thumbnail(large.path, written.path, 200, &error, error.count) == 0)
        #expect(try Data(contentsOf: written) == quick(Data(contentsOf: large)))
    }

    @Test func whatLibjpegDoesNotTakeLibvipsMakesAndBrokenImagesFailCleanly() throws {
        // Smaller than the thumbnail: libvips enlarges it.
        #expect(quick(Self.small) == nil)
        #expect(try size(thumbnail(Self.small)) == (200, 200))
        // Not a JPEG.
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("thumbnails-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let input = folder.appendingPathComponent("photo.jpg"), png = folder.appendingPathComponent("photo.png")
        try Self.photo.write(to: input)
        var error = [CChar](repeating: 0, count: 512)
        #expect(imageops_apply(input.path, png.path, "grayscale", 0, &error, error.count) == 0)
        let pngBytes = try Data(contentsOf: png)
        #expect(quick(pngBytes) == nil)
        #expect(try size(thumbnail(pngBytes)) == (200, 200))
        // An embedded ICC profile: libvips converts the colours, so it makes that one.
        var profiled = [UInt8](Self.photo)
        let profile = Array("ICC_PROFILE".utf8) + [0, 1, 1] + [UInt8](repeating: 0, count: 128)
        profiled.insert(contentsOf: [0xFF, 0xE2, UInt8((profile.count + 2) >> 8), UInt8((profile.count + 2) & 0xFF)] + profile, at: 2)
        #expect(quick(Data(profiled)) == nil)
        // Garbage behind a JPEG's first bytes: an error from both paths, no crash.
        var random = SystemRandomNumberGenerator()
        for length in [3, 4, 100, 20_000] {
            let garbage = Data([0xFF, 0xD8, 0xFF] + (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) })
            #expect(quick(garbage) == nil)
            #expect(throws: Failure.self) { try thumbnail(garbage) }
        }
        // A photo cut short still decodes (the rest grey, as libvips does by default) or fails: never a crash.
        for cut in stride(from: 200, to: Self.photo.count, by: 1_500) {
            _ = quick(Self.photo.prefix(cut))
        }
    }
}

/// A model's answer is measured before it is decoded, as an upload is.
@Suite("A model's image", .timeLimit(.minutes(5)))
struct ModelImageCheckTests {
    /// A PNG header saying `width` x `height`, and nothing after it.
    static func pngHeader(width: UInt32, height: UInt32) -> Data {
        var bytes: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13] + Array("IHDR".utf8)
        for value in [width, height] { bytes += [UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)] }
        return Data(bytes + [8, 2, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test func anImageBombFromAModelIsRefusedFromItsHeaderAndAPhotoIsMeasured() async throws {
        let runner = EffectRunner(scratch: FileManager.default.temporaryDirectory, maxPixels: 50_000_000)
        let refusal = await #expect(throws: EffectError.self) {
            try await runner.checkSize(Self.pngHeader(width: 100_000, height: 100_000), what: "the model's image")
        }
        #expect(refusal?.description == "the model's image is 100000x100000, over the limit of 50000000 pixels")
        #expect(refusal?.retryable == false)
        #expect(try await runner.checkSize(ThumbnailTests.photo, what: "the model's image") == ImageSize(width: 640, height: 480))
        // Not an image at all: libvips says so.
        await #expect(throws: EffectError.self) { try await runner.checkSize(Data("not an image".utf8), what: "the model's image") }
    }
}
