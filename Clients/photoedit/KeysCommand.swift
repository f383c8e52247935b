import ArgumentParser
import Crypto
import Foundation

/// `photoedit keys`: the bus's CURVE keys for one deployment, as environment settings (single-
/// quoted: Z85 has shell characters, none of them a quote), which a shell or compose reads: the
/// services' server key pair, a key pair per role, and the allow-list every service admits.
/// Each process is started with `BUS_CURVE_PUBLIC` and its role's key as `BUS_CURVE_KEY`;
/// quota, jobs and history also with `BUS_CURVE_SECRET` and `BUS_CURVE_CLIENTS`.
///
/// `photoedit keys --from FILE --role ROLE --output HOSTFILE` cuts one host's file out of the
/// deployment's: `BUS_CURVE_PUBLIC` and the role's own key as `BUS_CURVE_KEY`, and for quota, jobs
/// and history the server's secret key and the allow-list too. A GPU host gets the worker's key
/// only: nothing that lets it call as another role or serve as the services.
///
/// CURVE keys are X25519 keys (libzmq's CURVE is CurveZMQ over NaCl's `crypto_box`), made here
/// with swift-crypto and written in Z85 (ZeroMQ RFC 32), as `curve_keygen` writes them.
struct KeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys",
        abstract: "Make the bus's CURVE keys: a server pair, a pair per role, the allow-list (keep the output secret)."
    )

    @Option(name: [.customLong("output"), .customLong("out")], help: "Write to this file (mode 600) instead of printing.") var output: String?
    @Option(help: "With --from: write only what one host of this role needs (its key, the server's public key; the services' secrets for quota, jobs, history).")
    var role: String?
    @Option(help: "The deployment's keys file (from `photoedit keys --output`) to take one role's settings from (with --role).")
    var from: String?
    @Option(help: "Add a second key for this role to an existing file's allow-list (rotation): the old key stays listed until you remove it.")
    var rotate: String?

    static let roles = ["gateway", "quota", "jobs", "history", "worker", "operator"]

    /// The roles whose processes serve the bus (and so hold the server's secret key and the list).
    static let servingRoles: Set<String> = ["quota", "jobs", "history"]

    func run() throws {
        var lines: [String]
        if role != nil || from != nil {
            guard let role, let from, rotate == nil else { throw ValidationError("--role and --from go together, without --rotate") }
            lines = try Self.host(role: role, from: from)
        } else if let role = rotate {
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

    /// The settings of one host of `role`, from the deployment's keys file at `path`.
    static func host(role: String, from path: String) throws -> [String] {
        guard roles.contains(role) else { throw ValidationError("roles: \(roles.joined(separator: ", "))") }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw ValidationError("cannot read \(path)") }
        var settings: [String: String] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { settings[String(parts[0])] = String(parts[1]) }
        }
        func setting(_ name: String) throws -> String {
            guard let value = settings[name] else { throw ValidationError("\(path) has no \(name): is it a file `photoedit keys --output` made?") }
            return value
        }
        var lines = [
            "# The bus's CURVE keys of one \(role) host, cut by `photoedit keys --role \(role)` from the deployment's file. Secret.",
            "BUS_CURVE_PUBLIC=\(try setting("BUS_CURVE_PUBLIC"))",
            "BUS_CURVE_KEY=\(try setting("\(role.uppercased())_BUS_CURVE_KEY"))",
        ]
        if servingRoles.contains(role) {
            lines += ["BUS_CURVE_SECRET=\(try setting("BUS_CURVE_SECRET"))", "BUS_CURVE_CLIENTS=\(try setting("BUS_CURVE_CLIENTS"))"]
        }
        return lines
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
