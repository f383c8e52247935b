import Bus
import Messages
import ZeroMQ

/// CURVE on the bus, from the environment: services read the server key pair's secret half
/// (`BUS_CURVE_SECRET`, Z85), callers its public half (`BUS_CURVE_PUBLIC`) and make an ephemeral
/// key pair of their own. Unset, traffic is plain (and binds to loopback by default).
public enum BusSecurity {
    /// The secret key a service binds with, nil when CURVE is off.
    public static func serverSecretKey(_ environment: Environment) throws -> [UInt8]? {
        guard let text = environment.optional("BUS_CURVE_SECRET") else { return nil }
        guard let key = ZMQCurveKeyPair.decode(z85: text) else {
            throw ConfigurationError(key: "BUS_CURVE_SECRET", value: "(hidden)", expected: "a 40-character Z85 CURVE key")
        }
        return key
    }

    /// The keys a caller connects with, nil when CURVE is off: its own key pair is
    /// `BUS_CURVE_KEY` (the secret half, Z85; its public half is what services list in
    /// `BUS_CURVE_CLIENTS`), or a new one each start when that is unset.
    public static func clientKeys(_ environment: Environment) throws -> CurveClientKeys? {
        guard let text = environment.optional("BUS_CURVE_PUBLIC") else { return nil }
        guard let server = ZMQCurveKeyPair.decode(z85: text) else {
            throw ConfigurationError(key: "BUS_CURVE_PUBLIC", value: text, expected: "a 40-character Z85 CURVE key")
        }
        let own: ZMQCurveKeyPair
        if let secret = environment.optional("BUS_CURVE_KEY") {
            guard let publicKey = ZMQCurveKeyPair.publicKey(ofSecret: secret) else {
                throw ConfigurationError(key: "BUS_CURVE_KEY", value: "(hidden)", expected: "a 40-character Z85 CURVE secret key")
            }
            own = ZMQCurveKeyPair(publicKey: publicKey, secretKey: secret)
        } else {
            own = try ZMQCurveKeyPair.generate()
        }
        guard let publicKey = ZMQCurveKeyPair.decode(z85: own.publicKey), let secretKey = ZMQCurveKeyPair.decode(z85: own.secretKey) else {
            throw ConfigurationError(key: "BUS_CURVE_PUBLIC", value: text, expected: "a key libzmq can use")
        }
        return CurveClientKeys(serverPublicKey: server, publicKey: publicKey, secretKey: secretKey)
    }

    public static let environmentKeys = ["BUS_CURVE_SECRET", "BUS_CURVE_PUBLIC", "BUS_ALLOW_PLAINTEXT", "BUS_CURVE_KEY", "BUS_CURVE_CLIENTS"]

    /// The callers a service admits (`BUS_CURVE_CLIENTS`): `role:PUBLICKEY` pairs, comma- or
    /// space-separated (a caller may be listed with two keys while its keys are rotated); nil
    /// when unset (any caller with the server key connects, and roles are not checked).
    public static func knownCallers(_ environment: Environment) throws -> [[UInt8]: BusRole]? {
        guard let text = environment.optional("BUS_CURVE_CLIENTS") else { return nil }
        var callers: [[UInt8]: BusRole] = [:]
        for entry in text.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\n" }) {
            let parts = entry.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, let key = ZMQCurveKeyPair.decode(z85: String(parts[1])),
                  BusRole.known.contains(BusRole(rawValue: String(parts[0]))) else {
                throw ConfigurationError(key: "BUS_CURVE_CLIENTS", value: String(entry.prefix(60)),
                                         expected: "role:PUBLICKEY pairs, roles \(BusRole.known.map(\.rawValue).joined(separator: ", "))")
            }
            callers[key] = BusRole(rawValue: String(parts[0]))
        }
        return callers
    }

    /// Whether `endpoint` can be reached only from this machine: `ipc://`, `inproc://`, or
    /// `tcp://` on a loopback address (`127.x.x.x`, `::1`, `localhost`, `lo`).
    public static func isLocal(_ endpoint: String) -> Bool {
        if endpoint.hasPrefix("ipc://") || endpoint.hasPrefix("inproc://") { return true }
        guard endpoint.hasPrefix("tcp://") else { return false }
        var host = String(endpoint.dropFirst("tcp://".count))
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
            host = String(host[host.index(after: host.startIndex)..<close])
        } else if let colon = host.lastIndex(of: ":") {
            host = String(host[..<colon])
        }
        return host == "localhost" || host == "lo" || host == "::1" || host.split(separator: ".").first == "127"
    }

    /// Refuses to serve the bus where other machines can reach it without knowing its callers:
    /// an endpoint bound off loopback needs CURVE (`BUS_CURVE_SECRET`), unless the operator says
    /// with `BUS_ALLOW_PLAINTEXT=1` that the network is private; and with CURVE, the callers it
    /// admits by key and role (`BUS_CURVE_CLIENTS`): without the list any holder of the server's
    /// public key (every worker host has it) would call as any role, `quota.set-plan` included.
    public static func checkExposure(_ endpoint: String, variable: String, curve: Bool, knownCallers: Bool, environment: Environment) throws {
        guard !isLocal(endpoint) else { return }
        if curve {
            guard knownCallers else { throw UnlistedCallers(variable: variable, endpoint: endpoint) }
        } else if environment.string("BUS_ALLOW_PLAINTEXT", default: "") != "1" {
            throw PlaintextExposure(variable: variable, endpoint: endpoint)
        }
    }
}

/// A bus endpoint that other machines could reach with CURVE but no list of its callers.
public struct UnlistedCallers: Error, CustomStringConvertible {
    public var variable: String
    public var endpoint: String

    public var description: String {
        "\(variable)=\(endpoint) is reachable from other machines and BUS_CURVE_CLIENTS is not set: refusing to admit callers "
            + "without checking their roles. Set BUS_CURVE_CLIENTS to the role:PUBLICKEY list `photoedit keys` writes (docs/bus.md, \"CURVE\")."
    }
}

/// A bus endpoint that other machines could reach in plain text.
public struct PlaintextExposure: Error, CustomStringConvertible {
    public var variable: String
    public var endpoint: String

    public var description: String {
        "\(variable)=\(endpoint) is reachable from other machines and BUS_CURVE_SECRET is not set: refusing to serve the bus in plain text "
            + "on the network. Set BUS_CURVE_SECRET (docs/bus.md, \"CURVE\"), or BUS_ALLOW_PLAINTEXT=1 if this network is private."
    }
}
