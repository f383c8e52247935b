import Bus
import Foundation
import Logging
import ServiceKit

/// What a worker process reads from the environment.
public struct WorkerConfiguration: Sendable {
    /// The jobs service's worker endpoint (`JOBS_WORKER_ENDPOINT`, default `tcp://127.0.0.1:7104`).
    public var endpoint: String
    /// Jobs run at once (`WORKER_CAPACITY`, default 1; see docs/jobs.md for why).
    public var capacity: Int
    /// Jobs taken beyond those and kept waiting, their inputs fetched, so the next is in hand
    /// when a place frees (`WORKER_PREFETCH`, at most 64; default one per four places, rounded
    /// up: 1 for the default capacity of 1, 2 for 8).
    public var prefetch: Int
    /// This worker's name in logs (`WORKER_ID`, default host and pid).
    public var workerId: String
    /// Where the worker keeps a job's input and outputs while it runs (`WORKER_SCRATCH_DIR`; nil
    /// for the default, a folder of its own under the system's temporary folder, swept when its
    /// worker is gone: `ScratchFolder`). Nothing is shared: the input comes and the outputs go
    /// through the presigned URLs of the job's assignment.
    public var scratchDirectory: String?
    /// Heartbeat interval (`WORKER_HEARTBEAT_MS`, default 1000); the jobs service is presumed
    /// dead after three silent intervals.
    public var heartbeat: Duration
    /// The least severe log level printed (`LOG_LEVEL`).
    public var logLevel: Logger.Level
    /// How log lines are written (`LOG_FORMAT`: `text`, the default, or `json`).
    public var logFormat: LogFormat
    /// How the worker protocol's messages are written (`BUS_ENCODING`, default binary).
    public var busEncoding: BusEncoding
    /// Effect ids this worker takes (`WORKER_EFFECTS`, comma-separated; default `*`, every
    /// effect: the assignment carries the effect's description, remote ones included).
    public var effects: [String]
    /// CURVE keys for the worker channel (`BUS_CURVE_PUBLIC`); nil for plain traffic.
    public var curve: CurveClientKeys?
    /// The most pixels an input image may have (`IMAGE_MAX_PIXELS`, default 50 megapixels, as
    /// the gateway's upload check): a larger one fails the job before any pixel is decoded.
    public var maxPixels: Int
    /// How long a job waits for disk space when its output cannot be written because the disk
    /// is full (`WORKER_STORAGE_WAIT_S`, default 600), before it fails as retryable.
    public var storageWait: Duration

    public init(environment: Environment) throws {
        endpoint = environment.string("JOBS_WORKER_ENDPOINT", default: "tcp://127.0.0.1:7104")
        capacity = min(64, max(1, try environment.int("WORKER_CAPACITY", default: 1)))
        prefetch = min(64, max(0, try environment.int("WORKER_PREFETCH", default: (capacity + 3) / 4)))
        workerId = environment.string("WORKER_ID", default: "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)")
        let scratch = environment.string("WORKER_SCRATCH_DIR", default: "")
        scratchDirectory = scratch.isEmpty ? nil : scratch
        heartbeat = .milliseconds(max(50, try environment.int("WORKER_HEARTBEAT_MS", default: 1000)))
        logLevel = try environment.logLevel()
        logFormat = try environment.logFormat()
        busEncoding = try environment.busEncoding()
        curve = try BusSecurity.clientKeys(environment)
        maxPixels = try environment.int("IMAGE_MAX_PIXELS", default: 50_000_000)
        storageWait = .seconds(max(0, try environment.int("WORKER_STORAGE_WAIT_S", default: 600)))
        effects = environment.string("WORKER_EFFECTS", default: "*").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
    }

    public static let environmentKeys = [
        "JOBS_WORKER_ENDPOINT", "WORKER_CAPACITY", "WORKER_PREFETCH", "WORKER_ID", "WORKER_SCRATCH_DIR", "WORKER_HEARTBEAT_MS",
        "LOG_LEVEL", "LOG_FORMAT", "WORKER_EFFECTS", "BUS_CURVE_PUBLIC", "BUS_CURVE_KEY",
        "IMAGE_MAX_PIXELS", "WORKER_STORAGE_WAIT_S", "BUS_ENCODING",
    ] + ProviderSettings.environmentKeys
}
