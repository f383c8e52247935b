import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// Whether a pool's PostgreSQL is down, found by a probe of its own: a TCP connection to the
/// server's port and a protocol startup message, whose answer tells an accepting server
/// (authentication asked for) from one that is not (refused, closed, or an error such as "the
/// database system is starting up"). A server at its `max_connections` answers "sorry, too many
/// clients already" (SQLSTATE 53300) before authentication: it is up, and full. Calls then wait
/// for a connection within their deadlines, as on a busy server; taken for down, it made every
/// pool of every service fail its calls at once, a whole stack's outage made by one full server.
/// A server that takes the connection and then says nothing for `silenceLimit`, probe after
/// probe, for `unreachableLimit` is down too: frozen (its processes stopped, SIGSTOP, or its host
/// hung), a state in which every statement sent to it would wait out its caller's deadline. A
/// connection that is not through within `probeTimeout` is no finding by itself, and the server
/// is taken for up: a busy machine never makes callers fail, it only keeps them waiting within
/// their deadlines. (A
/// connect timeout taken for down failed every PostgreSQL test at once when the whole suite
/// started together: with dozens of pools connecting in one process, the probes' connections were
/// not through in 500 ms, and each pool told its callers the server was gone.) The silence is
/// measured from the connection, by a timer of the connection's own event loop, which reads what
/// has arrived before it runs its timers: an event loop late in its work does not take an answer
/// that came for a silence; the probes have an event loop of their own (`probeLoop`), so a loop
/// held by a pool's work does not keep an answer unread either. One silence is not enough: on a
/// loaded 2-core machine (the store suites, each test making and dropping databases) PostgreSQL
/// took up to 1.4 s to ask a new connection for authentication (measured from another process),
/// and a silence of 2 s, taken for down at once, failed every pool's calls of the moment. An
/// address given as an IP is connected to without a name lookup. Nothing is authenticated: the
/// probe closes the connection at the first answer.
///
/// A server whose connections never go through, probe after probe, for `unreachableLimit` is
/// down too: cut off from this host (a partition drops the packets: neither refused nor answered).
/// The limit is far past what a busy machine's full accept queue costs a connection (a SYN
/// dropped once is sent again after 1 s). Such probes, and silent ones, are one run
/// (`UnreachableRun`) unless an answer comes between them or one starts more than `runGap` after
/// the last ended. A frozen server is so found down in about two silences (4.25 s).
///
/// Probes are asked for by operations that waited long for a connection or lost one; while the
/// server is down, the watch probes it every `probeEvery` by itself, so that it is found back
/// without any call having to try it.
final class PostgresOutage: Sendable {
    let host: String
    let port: Int
    let username: String
    let database: String

    /// How often, at most, the server is probed; and how often while it is down.
    static let probeEvery = Duration.milliseconds(250)
    /// How long a probe waits for its TCP connection to be through (past it: no finding, up).
    static let probeTimeout = TimeAmount.milliseconds(500)
    /// How long a server that took the probe's connection has to answer it (past it: silent, and
    /// down once such probes last `unreachableLimit`).
    static let silenceLimit = TimeAmount.seconds(2)

    /// The probes' own thread, no pool's connections on it: a probe measures the server's answer,
    /// not how busy the process's event loops are. It lives as long as the process, as
    /// `MultiThreadedEventLoopGroup.singleton` does.
    static let probeLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// How long probes may find no connection through, or no answer on one, before the server is
    /// taken for down.
    static let unreachableLimit = Duration.seconds(3)
    /// How long after one probe without an answer the next may start and still be of its run:
    /// a probe's cycle is `probeTimeout` and `probeEvery` (0.75 s), and a busy machine stretches
    /// it. (At 1 s, the bound it had, a cycle stretched past it on a busy machine began the run
    /// again, probe after probe, and a server cut off by a partition was never found down: its
    /// callers waited out their deadlines, 504s at the gateway in CI's `make hosts-chaos`.)
    static let runGap = Duration.seconds(2)

    /// Since when the server is found down; nil while it is up (or not probed yet).
    private let downSince = Mutex<ContinuousClock.Instant?>(nil)
    /// Whether the last probe found the server full (logged once each time it is found so).
    private let full = Mutex(false)
    /// How many probes `run()` has made and noted (for tests to wait for one).
    let probesMade = Atomic(0)
    /// The probes in a row whose connection has not gone through.
    private let unreachable = Mutex(UnreachableRun())
    private let logger: Logger
    private let requests: AsyncStream<Void>
    private let request: AsyncStream<Void>.Continuation

    init(host: String, port: Int, username: String, database: String, logger: Logger) {
        self.host = host
        self.port = port
        self.username = username
        self.database = database
        self.logger = logger
        (requests, request) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Whether the last probe found the server down.
    var isDown: Bool { downSince.withLock { $0 != nil } }

    /// Asks for a probe (at most one runs every `probeEvery`; a request meanwhile waits for it).
    func suspect() { request.yield() }

    /// Probes when asked, and every `probeEvery` while the server is down, until cancelled.
    func run() async {
        for await _ in requests {
            while !Task.isCancelled {
                let started = ContinuousClock.now
                let finding = await probe()
                let reachable: Bool
                switch finding {
                case .accepting, .full, .refusing:
                    unreachable.withLock { $0.answered() }
                    reachable = finding != .refusing
                case .notThrough, .silent:
                    let length = unreachable.withLock { $0.notThrough(from: started, to: .now) }
                    reachable = length < Self.unreachableLimit
                }
                note(reachable: reachable, finding: finding)
                probesMade.add(1, ordering: .releasing)
                guard (try? await Task.sleep(for: Self.probeEvery)) != nil, !reachable else { break }
            }
        }
    }

    /// Records what a probe found; an operator reads when the server is found down, and back,
    /// and when it is found full.
    private func note(reachable: Bool, finding: Finding) {
        if full.withLock({ full in defer { full = finding == .full }; return !full && finding == .full }) {
            logger.warning("PostgreSQL is at its connection limit (max_connections): calls wait for a connection",
                           metadata: ["server": "\(host):\(port)"])
        }
        let (wasDown, since) = downSince.withLock { downSince in
            let was = downSince
            downSince = reachable ? nil : (downSince ?? .now)
            return (was, downSince)
        }
        if wasDown == nil, since != nil {
            logger.warning("PostgreSQL found down: calls fail at once until it is back",
                           metadata: ["server": "\(host):\(port)", "finding": "\(finding)"])
        } else if let wasDown, since == nil {
            logger.info("PostgreSQL is back", metadata: ["server": "\(host):\(port)", "down": "\(wasDown.duration(to: .now))"])
        }
    }

    /// What one probe found.
    enum Finding: Sendable { case accepting, full, refusing, silent, notThrough }

    /// The probes under way in this process, by server (`host:port`), each one's finding to come.
    private static let underWay = Mutex<[String: EventLoopFuture<Finding>]>([:])

    /// Whether the server accepts connections now, is full (at `max_connections`), refuses them
    /// (closed, another error), took the connection and did not answer within `silenceLimit`, or
    /// could not be reached within `probeTimeout`.
    ///
    /// One probe of a server at a time in a process: a probe asked for while another of the same
    /// server is under way (another pool's) waits for that one's finding. The server answers a
    /// startup message before it looks at the database or the user, so the finding is the
    /// server's. (Each pool probing for itself, a moment that made every pool's operations slow
    /// sent the server a new connection from each, dozens in the store suites, and a fork each;
    /// answered late, they were taken for silences, and the server for down, probe after probe.)
    func probe() async -> Finding {
        let server = "\(host):\(port)"
        let (finding, mine) = Self.underWay.withLock { underWay -> (EventLoopFuture<Finding>, EventLoopPromise<Finding>?) in
            if let under = underWay[server] { return (under, nil) }
            let promise = Self.probeLoop.any().makePromise(of: Finding.self)
            underWay[server] = promise.futureResult
            return (promise.futureResult, promise)
        }
        if let mine {
            let found = await probeOnce()
            _ = Self.underWay.withLock { $0.removeValue(forKey: server) }
            mine.succeed(found)
        }
        return (try? await finding.get()) ?? .refusing
    }

    /// One probe of the server (`probe()`'s notes).
    private func probeOnce() async -> Finding {
        let startup = Self.startupMessage(username: username, database: database)
        let group = Self.probeLoop
        let answer = group.any().makePromise(of: Finding.self)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(Self.probeTimeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(StartupProbe(startup: startup, answer: answer))
                }
            }
        do {
            let connecting = (try? SocketAddress(ipAddress: host, port: port)).map { bootstrap.connect(to: $0) }
                ?? bootstrap.connect(host: host, port: port)
            let channel = try await connecting.get()
            // Connected and silent: frozen, if it lasts (see the type's notes).
            channel.eventLoop.scheduleTask(in: Self.silenceLimit) { answer.succeed(.silent) }
            let finding = (try? await answer.futureResult.get()) ?? .refusing
            try? await channel.close()
            return finding
        } catch ChannelError.connectTimeout {
            // No answer in time is no finding by itself (see the type's notes).
            answer.succeed(.notThrough)
            return .notThrough
        } catch {
            answer.succeed(.refusing)
            return .refusing
        }
    }

    /// A protocol 3.0 StartupMessage: its length, the version, then name and value pairs.
    static func startupMessage(username: String, database: String) -> [UInt8] {
        var body: [UInt8] = [0, 3, 0, 0]
        for (name, value) in [("user", username), ("database", database)] {
            body += Array(name.utf8) + [0] + Array(value.utf8) + [0]
        }
        body.append(0)
        let length = UInt32(body.count + 4)
        return [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)] + body
    }
}

/// Sends the startup message and answers what the server's first message says: authentication
/// asked for (`R`: it accepts connections), an ErrorResponse (`E`) whose SQLSTATE is 53300 (too
/// many connections: up, and full), or anything else (another error, or the connection closed):
/// refusing. The first message is read whole, however the bytes arrive, up to `maxMessage`.
final class StartupProbe: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    let startup: [UInt8]
    let answer: EventLoopPromise<PostgresOutage.Finding>
    private var received: ByteBuffer?

    /// Longer than any ErrorResponse PostgreSQL sends before authentication (about 100 bytes).
    static let maxMessage = 8_192

    init(startup: [UInt8], answer: EventLoopPromise<PostgresOutage.Finding>) {
        self.startup = startup
        self.answer = answer
    }

    func channelActive(context: ChannelHandlerContext) {
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: startup)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        if received == nil { received = buffer } else { received!.writeBuffer(&buffer) }
        if let finding = Self.finding(received!) { answer.succeed(finding) }
    }

    /// What the first message in `bytes` says; nil while it is not all there.
    static func finding(_ bytes: ByteBuffer) -> PostgresOutage.Finding? {
        guard let kind = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self) else { return nil }
        if kind == UInt8(ascii: "R") { return .accepting }
        guard kind == UInt8(ascii: "E") else { return .refusing }
        guard let length = bytes.getInteger(at: bytes.readerIndex + 1, as: Int32.self) else { return nil }
        guard length >= 4, length <= maxMessage else { return .refusing }
        guard let body = bytes.getBytes(at: bytes.readerIndex + 5, length: Int(length) - 4) else { return nil }
        // Fields: a type byte and a NUL-terminated value each, then a NUL. `C` is the SQLSTATE.
        var fields = body[...]
        while let type = fields.first, type != 0 {
            let value = fields.dropFirst().prefix { $0 != 0 }
            if type == UInt8(ascii: "C") { return value.elementsEqual("53300".utf8) ? .full : .refusing }
            fields = fields.dropFirst(value.count + 2)
        }
        return .refusing
    }

    func channelInactive(context: ChannelHandlerContext) {
        answer.succeed(.refusing)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        answer.succeed(.refusing)
        context.close(promise: nil)
    }
}

/// Probes in a row without an answer (the connection not through, or silent): its length, from
/// the first's start to the last's end, is how long the server has been out of reach. An answer
/// ends it, and so does a gap of more than `PostgresOutage.runGap` from one probe's end to the
/// next one's start (a probe long ago and one now say nothing about the time between them).
struct UnreachableRun {
    private(set) var first: ContinuousClock.Instant?
    private(set) var last: ContinuousClock.Instant?

    /// Notes a probe from `start` to `end` that got no answer; the run's length.
    mutating func notThrough(from start: ContinuousClock.Instant, to end: ContinuousClock.Instant) -> Duration {
        if let last, last.duration(to: start) <= PostgresOutage.runGap, let first {
            self.last = end
            return first.duration(to: end)
        }
        first = start
        last = end
        return start.duration(to: end)
    }

    /// Notes an answer: the run ends.
    mutating func answered() {
        first = nil
        last = nil
    }
}
