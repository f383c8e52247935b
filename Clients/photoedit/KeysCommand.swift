import ArgumentParser
import Crypto
import Foundation

/// `photoedit keys`: the bus's CURVE keys for one deployment, as environment settings (single-
/// quoted: Z85 has shell characters, none of them a quote), which a shell or compose reads: the
/// services' server key pair, a key pair per role, and the allow-list every service admits.
/// Each process is started with `BUS_CURVE_PUBLIC` and its role's key as `BUS_CURVE_KEY`;
/// quota, jobs and history also with `BUS_CURVE_SECRET` and `BUS_CURVE_CLIENTS`.
///
/// CURVE keys are X25519 keys (libzmq's CURVE is CurveZMQ over NaCl's `crypto_box`), made here
/// with swift-crypto and written in Z85 (ZeroMQ RFC 32), as `curve_keygen` writes them.
struct KeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys",
        abstract: "Make the bus's CURVE keys: a server pair, a pair per role, the allow-list (keep the output secret)."
    )

    @Option(help: "Write to this file (mode 600) instead of printing.") var output: String?
    @Option(help: "Add a second key for this role to an existing file's allow-list (rotation): the old key stays listed until you remove it.")
    var rotate: String?

    static let roles = ["gateway", "quota", "jobs", "history", "worker", "operator"]

    func run() throws {
        var lines: [String]
        if let role = rotate {
            guard Self.roles.contains(role) else { throw ValidationError("roles: \(Self.roles.joined(separator: ", "))") }
            guard let output, let existing = try? String(contentsOfFile: output, encoding: .utf8) else {
                throw ValidationError("--rotate needs --output naming the existing keys file")
            }
            let pair = Self.pair()
            lines = existing.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            let variable = "\(role.uppercased())_BUS_CURVE_KEY"
            lines = lines.map { line in
                if line.hasPrefix("BUS_CURVE_CLIENTS='"), line.hasSuffix("'") { return line.dropLast() + ",\(role):\(pair.public)'" }
                if line.hasPrefix("\(variable)=") { return "\(variable)='\(pair.secret)'\n# the previous \(role) key, listed until removed: \(line.dropFirst(variable.count + 1))" }
                return line
            }
        } else {
            let server = Self.pair()
            var clients: [String] = []
            lines = [
                "# The bus's CURVE keys, made by `photoedit keys`. Secret: anyone with a key calls as its role.",
                "BUS_CURVE_SECRET='\(server.secret)'",
                "BUS_CURVE_PUBLIC='\(server.public)'",
            ]
            for role in Self.roles {
                let pair = Self.pair()
                lines.append("\(role.uppercased())_BUS_CURVE_KEY='\(pair.secret)'")
                clients.append("\(role):\(pair.public)")
            }
            lines.append("BUS_CURVE_CLIENTS='\(clients.joined(separator: ","))'")
        }
        let text = lines.joined(separator: "\n") + (lines.last?.isEmpty == true ? "" : "\n")
        if let output {
            guard FileManager.default.createFile(atPath: output, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600]) else {
                throw ValidationError("cannot write \(output)")
            }
        } else {
            print(text, terminator: "")
        }
    }

    /// A new key pair, Z85.
    static func pair() -> (public: String, secret: String) {
        let key = Curve25519.KeyAgreement.PrivateKey()
        return (Z85.encode(Array(key.publicKey.rawRepresentation)), Z85.encode(Array(key.rawRepresentation)))
    }
}

/// ZeroMQ's Z85 (RFC 32): 4 bytes to 5 characters, big-endian base 85.
enum Z85 {
    static let alphabet = Array("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")

    static func encode(_ bytes: [UInt8]) -> String {
        precondition(bytes.count % 4 == 0, "Z85 encodes whole 4-byte groups")
        var text: [Character] = []
        for group in stride(from: 0, to: bytes.count, by: 4) {
            var value = bytes[group..<group + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            var chunk = [Character](repeating: "0", count: 5)
            for index in (0..<5).reversed() {
                chunk[index] = alphabet[Int(value % 85)]
                value /= 85
            }
            text += chunk
        }
        return String(text)
    }
}
