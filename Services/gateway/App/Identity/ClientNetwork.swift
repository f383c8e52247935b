import Foundation
import Glibc
import HTTPTypes
import Hummingbird
import NIOCore

/// The client network a request comes from: a /24 for IPv4, a /56 for IPv6, the unit guests are
/// limited by (a script rotating device ids rotates no addresses; a network's users share them).
///
/// The address is the connection's peer, unless that peer is one of `TRUSTED_PROXIES` (CIDRs,
/// comma-separated): then the right-most address of `X-Forwarded-For` that is not itself a
/// trusted proxy (what each proxy appended; anything left of it the client could have written).
/// A client on loopback (the operator's own machine: `make loadtest`, the tests) has no network:
/// it is not limited.
public struct ClientNetworks: Sendable {
    let trusted: [IPRange]

    public init(trustedProxies: String?) throws {
        trusted = try (trustedProxies ?? "").split(separator: ",").map { text in
            let trimmed = text.trimmingCharacters(in: .whitespaces)
            guard let range = IPRange(cidr: trimmed) else {
                throw Problem(.internalServerError, detail: "TRUSTED_PROXIES: '\(trimmed)' is not an address or CIDR")
            }
            return range
        }
    }

    /// The network key (`v4:203.0.113.0/24`, `v6:2001:db8:0:ab00::/56`), nil for loopback or an
    /// unknown peer.
    public func network(peer: SocketAddress?, forwardedFor: String?) -> String? {
        guard var address = peer.flatMap(IPAddress.init(socketAddress:)) else { return nil }
        if trusted.contains(where: { $0.contains(address) }), let forwardedFor {
            for hop in forwardedFor.split(separator: ",").reversed() {
                guard let hopAddress = IPAddress(text: hop.trimmingCharacters(in: .whitespaces)) else { break }
                address = hopAddress
                if !trusted.contains(where: { $0.contains(hopAddress) }) { break }
            }
        }
        return address.isLoopback ? nil : address.networkKey
    }
}

/// An IPv4 or IPv6 address, as 4 or 16 bytes.
struct IPAddress: Sendable, Equatable {
    var bytes: [UInt8]

    init?(text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            bytes = withUnsafeBytes(of: &v4) { Array($0) }
            return
        }
        var v6 = in6_addr()
        let trimmed = text.hasPrefix("[") && text.hasSuffix("]") ? String(text.dropFirst().dropLast()) : text
        if inet_pton(AF_INET6, trimmed, &v6) == 1 {
            let raw = withUnsafeBytes(of: &v6) { Array($0) }
            // An IPv4-mapped address is the IPv4 address.
            bytes = raw[0..<10].allSatisfy { $0 == 0 } && raw[10] == 0xFF && raw[11] == 0xFF ? Array(raw[12..<16]) : raw
            return
        }
        return nil
    }

    init?(socketAddress: SocketAddress) {
        guard let ip = socketAddress.ipAddress else { return nil }
        self.init(text: ip)
    }

    var isLoopback: Bool {
        bytes.count == 4 ? bytes[0] == 127 : bytes == [UInt8](repeating: 0, count: 15) + [1]
    }

    var networkKey: String {
        if bytes.count == 4 { return "v4:\(bytes[0]).\(bytes[1]).\(bytes[2]).0/24" }
        let prefix = Array(bytes[0..<7]) + [UInt8](repeating: 0, count: 9)
        var address = in6_addr()
        withUnsafeMutableBytes(of: &address) { $0.copyBytes(from: prefix) }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        inet_ntop(AF_INET6, &address, &text, socklen_t(text.count))
        let characters = text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return "v6:\(String(decoding: characters, as: UTF8.self))/56"
    }
}

/// An address range: an address and a prefix length.
struct IPRange: Sendable {
    var address: IPAddress
    var prefix: Int

    init?(cidr: String) {
        let parts = cidr.split(separator: "/", maxSplits: 1)
        guard let first = parts.first, let address = IPAddress(text: String(first)) else { return nil }
        let bits = address.bytes.count * 8
        let prefix = parts.count == 2 ? Int(parts[1]) : bits
        guard let prefix, (0...bits).contains(prefix) else { return nil }
        self.address = address
        self.prefix = prefix
    }

    func contains(_ other: IPAddress) -> Bool {
        guard other.bytes.count == address.bytes.count else { return false }
        var remaining = prefix
        for (a, b) in zip(address.bytes, other.bytes) where remaining > 0 {
            let mask: UInt8 = remaining >= 8 ? 0xFF : ~(0xFF >> UInt8(remaining))
            if a & mask != b & mask { return false }
            remaining -= 8
        }
        return true
    }
}
