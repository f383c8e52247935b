import Bus
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

    /// The keys a caller connects with, nil when CURVE is off.
    public static func clientKeys(_ environment: Environment) throws -> CurveClientKeys? {
        guard let text = environment.optional("BUS_CURVE_PUBLIC") else { return nil }
        guard let server = ZMQCurveKeyPair.decode(z85: text) else {
            throw ConfigurationError(key: "BUS_CURVE_PUBLIC", value: text, expected: "a 40-character Z85 CURVE key")
        }
        let own = try ZMQCurveKeyPair.generate()
        guard let publicKey = ZMQCurveKeyPair.decode(z85: own.publicKey), let secretKey = ZMQCurveKeyPair.decode(z85: own.secretKey) else {
            throw ConfigurationError(key: "BUS_CURVE_PUBLIC", value: text, expected: "a key libzmq can use")
        }
        return CurveClientKeys(serverPublicKey: server, publicKey: publicKey, secretKey: secretKey)
    }

    public static let environmentKeys = ["BUS_CURVE_SECRET", "BUS_CURVE_PUBLIC"]
}
