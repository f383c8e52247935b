import Foundation
import Synchronization

/// A second "host" for a test: a network namespace of its own joined to this one by a veth pair
/// (this side `hostAddress`, that side `guestAddress`, a /30 of 10.199.0.0/16 that exists only
/// inside this machine), made and removed by the test. A process started in it with `command`
/// also gets a mount namespace of its own in which the given folder is an empty tmpfs: it reaches
/// the system only over the veth, and sees none of its files.
final class TestHost: Sendable {
    let name: String
    let hostAddress: String
    let guestAddress: String
    private let hostSide: String

    static let counter = Mutex(Int(getpid() % 200))

    /// Whether this process may make network namespaces (root, with `ip` and `unshare`).
    static var available: Bool {
        getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/sbin/ip") && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare")
    }

    init() throws {
        let index = Self.counter.withLock { value in
            value = (value + 1) % 16_000
            return value
        }
        name = "pe-test-\(getpid())-\(index)"
        hostSide = "pe\(index)h"
        let guestSide = "pe\(index)g"
        let (high, low) = (index / 64, (index % 64) * 4)
        hostAddress = "10.199.\(high).\(low + 1)"
        guestAddress = "10.199.\(high).\(low + 2)"
        _ = Self.run(["ip", "netns", "del", name])
        _ = Self.run(["ip", "link", "del", hostSide])
        for command in [
            ["ip", "netns", "add", name],
            ["ip", "link", "add", hostSide, "type", "veth", "peer", "name", guestSide],
            ["ip", "link", "set", guestSide, "netns", name],
            ["ip", "addr", "add", "\(hostAddress)/30", "dev", hostSide],
            ["ip", "link", "set", hostSide, "up"],
            ["ip", "netns", "exec", name, "ip", "addr", "add", "\(guestAddress)/30", "dev", guestSide],
            ["ip", "netns", "exec", name, "ip", "link", "set", guestSide, "up"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
        ] {
            let (status, output) = Self.run(command)
            guard status == 0 else {
                remove()
                throw HostError(description: "\(command.joined(separator: " ")) failed: \(output)")
            }
        }
    }

    struct HostError: Error, CustomStringConvertible { var description: String }

    /// The command that runs a program in this host, with `hidden` an empty folder to it.
    func command(hiding hidden: URL) -> [String] {
        ["/usr/sbin/ip", "netns", "exec", name, "/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
         "mount -t tmpfs tmpfs \"\(hidden.path)\" && exec \"$0\""]
    }

    /// Runs `shell` in this host as `command` runs a program; its status and output.
    func run(_ shell: String, hiding hidden: URL) -> (Int32, String) {
        Self.run(Array(command(hiding: hidden).dropLast()) + ["mount -t tmpfs tmpfs \"\(hidden.path)\" && \(shell)"])
    }

    func remove() {
        _ = Self.run(["ip", "netns", "del", name])
        _ = Self.run(["ip", "link", "del", hostSide])
    }

    deinit { remove() }

    @discardableResult
    static func run(_ arguments: [String]) -> (Int32, String) {
        let (status, output, _) = runQuickCommand(["/usr/bin/env"] + arguments)
        return (status, output)
    }
}
