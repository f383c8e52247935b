import Bus
import Messages
import Foundation
import Logging

/// What every bus service process reads from the environment.
public struct ServiceConfiguration: Sendable {
    /// Which service this process is.
    public var service: ServiceName
    /// The endpoint it binds (`<SERVICE>_BIND`).
    public var bindEndpoint: String
    /// Its bound on requests in progress (`<SERVICE>_MAX_IN_FLIGHT`, default 1024).
    public var maxInFlight: Int
    /// The folder for its data (`DATA_DIR`, default `.data`).
    public var dataDirectory: String
    /// The least severe log level printed (`LOG_LEVEL`, default `info`).
    public var logLevel: Logger.Level
    /// How log lines are written (`LOG_FORMAT`, default `text`).
    public var logFormat: LogFormat = .text
    /// The CURVE secret key to bind with (`BUS_CURVE_SECRET`); nil for plain traffic.
    public var curveSecretKey: [UInt8]?
    /// The CURVE keys for this service's own calls to others (`BUS_CURVE_PUBLIC`, `BUS_CURVE_KEY`).
    public var curveClientKeys: CurveClientKeys?
    /// The callers it admits, by public key, with their roles (`BUS_CURVE_CLIENTS`); nil: any.
    public var knownCallers: [[UInt8]: BusRole]?
    /// How its own calls write bodies (`BUS_ENCODING`, default binary).
    public var busEncoding: BusEncoding = .binary

    public init(
        service: ServiceName,
        bindEndpoint: String? = nil,
        maxInFlight: Int = SharedDefaults.maxInFlight,
        dataDirectory: String = SharedDefaults.dataDirectory,
        logLevel: Logger.Level = .info
    ) {
        self.service = service
        self.bindEndpoint = bindEndpoint ?? service.defaultEndpoint
        self.maxInFlight = maxInFlight
        self.dataDirectory = dataDirectory
        self.logLevel = logLevel
    }

    /// Reads the configuration of `service` from `environment`.
    public init(service: ServiceName, environment: Environment) throws {
        self.init(
            service: service,
            bindEndpoint: environment.string(service.bindVariable, default: service.defaultEndpoint),
            maxInFlight: try environment.int(service.maxInFlightVariable, default: SharedDefaults.maxInFlight),
            dataDirectory: environment.string("DATA_DIR", default: SharedDefaults.dataDirectory),
            logLevel: try environment.logLevel()
        )
        busEncoding = try environment.busEncoding()
        logFormat = try environment.logFormat()
        curveSecretKey = try BusSecurity.serverSecretKey(environment)
        curveClientKeys = try BusSecurity.clientKeys(environment)
        knownCallers = try BusSecurity.knownCallers(environment)
        if knownCallers != nil && curveSecretKey == nil {
            throw ConfigurationError(key: "BUS_CURVE_CLIENTS", value: "(set)", expected: "used with BUS_CURVE_SECRET (callers are known by their CURVE keys)")
        }
    }

    /// The environment variables `init(service:environment:)` reads.
    public static func environmentKeys(for service: ServiceName) -> [String] {
        [service.bindVariable, service.maxInFlightVariable, "DATA_DIR", "LOG_LEVEL", "LOG_FORMAT", "BUS_ENCODING"] + BusSecurity.environmentKeys
    }

    /// A client of `endpoint` with this process's keys and encoding.
    public func client(of endpoint: String) -> BusClient.Configuration {
        BusClient.Configuration(endpoint: endpoint, curve: curveClientKeys, encoding: busEncoding)
    }
}
