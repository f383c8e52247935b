import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A plain TCP connection to the gateway, for what an HTTP client hides: a body that is never
/// finished, a stream dropped without a word. Reads time out after `timeout` seconds.
final class RawConnection: @unchecked Sendable {
    // @unchecked: used by one test task at a time.
    private var fd: Int32

    init(port: Int, timeout: Int = 10) throws {
        fd = -1
        // Closed once, by `connected`, when the connection fails: a class whose init throws still
        // runs its deinit, and a second close would hit whatever descriptor took the number.
        fd = try Self.connected(port: port)
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close() }

    /// A socket connected to `port` on loopback (blocking), or the error of the attempt.
    static func connected(port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let code = errno
            Glibc.close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .ECONNREFUSED)
        }
        return fd
    }

    /// Sends all of `bytes`; false if the connection refused them.
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { return false }
            sent += count
        }
        return true
    }

    @discardableResult
    func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// Reads until the text received contains one of `markers`, the peer closes, or a read times
    /// out; returns what was received. The reads block, so they run on a thread of their own: a
    /// test's blocking read on the cooperative pool held one of its threads (two on this machine)
    /// for up to `timeout`, and the in-process gateway's handlers, which answer it, need the pool
    /// (a 413 that "never came" within 10 s under load).
    func read(until markers: String...) async -> String {
        await offThePool { self.readBlocking(until: markers) }
    }

    /// `read(until:)` on the calling thread: only for a thread of the test's own.
    func readBlocking(until markers: [String]) -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while !markers.contains(where: { String(decoding: received, as: UTF8.self).contains($0) }) {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            received += buffer[0..<count]
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// Reads until the peer closes (or a read times out); every byte received. Off the pool, as
    /// `read(until:)`.
    func readAll() async -> [UInt8] {
        await offThePool {
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 64 << 10)
            while true {
                let count = buffer.withUnsafeMutableBytes { recv(self.fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { return received }
                received += buffer[0..<count]
            }
        }
    }

    /// An answer's head (as text) and body (as bytes).
    static func split(_ answer: [UInt8]) -> (head: String, body: [UInt8]) {
        let marker: [UInt8] = [13, 10, 13, 10]
        guard let end = (0..<max(0, answer.count - 3)).first(where: { Array(answer[$0..<($0 + 4)]) == marker }) else {
            return (String(decoding: answer, as: UTF8.self), [])
        }
        return (String(decoding: answer[..<end], as: UTF8.self), Array(answer[(end + 4)...]))
    }

    /// The `Content-Length` of an answer's head.
    static func contentLength(_ head: String) -> Int? {
        head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
            .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) }
    }

    func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }
}

/// Blocking work (a socket's reads, a crowd's connects) on a thread of its own, its result
/// awaited: never on the cooperative pool, whose threads (two on this machine) the in-process
/// servers under test need.
func offThePool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in Thread { continuation.resume(returning: work()) }.start() }
}

/// Images made in the test, so their sizes are exactly what a test needs.
enum TestImages {
    /// A real (decodable) 8-bit grayscale PNG of `width` x `height`, its pixel data stored
    /// uncompressed.
    static func png(width: Int, height: Int) -> Data {
        var raw: [UInt8] = []
        for row in 0..<height {
            raw.append(0)  // filter: none
            raw += (0..<width).map { UInt8(truncatingIfNeeded: $0 &+ row) }
        }
        var zlib: [UInt8] = [0x78, 0x01]
        var offset = 0
        repeat {
            let count = min(65_535, raw.count - offset)
            let last: UInt8 = offset + count == raw.count ? 1 : 0
            zlib += [last, UInt8(count & 0xFF), UInt8(count >> 8), UInt8(~count & 0xFF), UInt8((~count >> 8) & 0xFF)]
            zlib += raw[offset..<(offset + count)]
            offset += count
        } while offset < raw.count
        zlib += be32(adler32(raw))
        var header = be32(width) + be32(height)
        header += [8, 0, 0, 0, 0]  // 8-bit, grayscale, deflate, adaptive filters, no interlace
        return Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + chunk("IHDR", header) + chunk("IDAT", zlib) + chunk("IEND", []))
    }

    /// A PNG whose header claims `width` x `height` over a few bytes of pixel data: an image bomb
    /// as far as any header check is concerned.
    static func pngHeader(width: Int, height: Int) -> Data {
        var header = be32(width) + be32(height)
        header += [8, 0, 0, 0, 0]
        return Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + chunk("IHDR", header) + chunk("IDAT", [0x78, 0x01, 0x01, 0, 0, 0xFF, 0xFF]) + chunk("IEND", []))
    }

    static func chunk(_ type: String, _ data: [UInt8]) -> [UInt8] {
        let body = Array(type.utf8) + data
        return be32(data.count) + body + be32(Int(crc32(body)))
    }

    static func be32(_ value: Int) -> [UInt8] { [UInt8(value >> 24 & 0xFF), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)] }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return ~crc
    }

    static func adler32(_ bytes: [UInt8]) -> Int {
        var a = 1, b = 0
        for byte in bytes {
            a = (a + Int(byte)) % 65_521
            b = (b + a) % 65_521
        }
        return b << 16 | a
    }
}
