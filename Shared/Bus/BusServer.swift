import DequeModule
import Foundation
import Logging
import Messages
import Metrics
import ServiceLifecycle
import Synchronization
import Threads
import ZeroMQ

/// A service's side of the bus: a ROUTER socket bound to the service's endpoint, owned by a
/// dedicated I/O thread, which hands each request to its `BusRouter` handler as a task. Handler
/// tasks prefer the I/O thread's executor, so a request that awaits nothing else is answered in
/// the same turn of the loop that read it; handlers must therefore not block.
///
/// At most `maxInFlight` requests run at once; past that a request is answered `overloaded` at
/// once. Garbage is answered `bad_request` when its sender can be named, otherwise dropped. On
/// graceful shutdown the server answers new requests `unavailable`, lets the requests in progress
/// finish, sends their replies and returns from `run()`.
public final class BusServer: Service, Sendable {
    /// Where a server binds and how much it takes on.
    public struct Configuration: Sendable {
        /// The endpoint to bind, such as `tcp://127.0.0.1:7101`.
        public var endpoint: String
        /// The most requests in progress at once.
        public var maxInFlight: Int
        /// The largest request accepted, in bytes; a larger one disconnects its sender.
        public var maxMessageBytes: Int64
        /// libzmq's queue limits (`ZMQ_SNDHWM`, `ZMQ_RCVHWM`).
        public var highWaterMark: Int32
        /// How long replies still queued at close are kept for delivery, in milliseconds.
        public var lingerMilliseconds: Int32
        /// CURVE secret key (32 bytes) to require encrypted, authenticated peers; nil for plain.
        public var curveSecretKey: [UInt8]?
        /// Callers are known by key (`BusAuthentication` installed): each request carries its
        /// caller's role, which the router checks against the method's.
        public var knownCallers = false

        public init(
            endpoint: String,
            maxInFlight: Int = SharedDefaults.maxInFlight,
            maxMessageBytes: Int64 = 1 << 20,
            highWaterMark: Int32 = 10_000,
            lingerMilliseconds: Int32 = 2000,
            curveSecretKey: [UInt8]? = nil
        ) {
            self.endpoint = endpoint
            self.maxInFlight = maxInFlight
            self.maxMessageBytes = maxMessageBytes
            self.highWaterMark = highWaterMark
            self.lingerMilliseconds = lingerMilliseconds
            self.curveSecretKey = curveSecretKey
        }
    }

    private struct Reply {
        var identity: [UInt8]
        var requestId: UInt64
        var encoding: BusEncoding
        var result: Result<[UInt8], BusError>
        /// The request came in a batch: its reply may go in one with others to the same caller.
        var batched = false
    }

    private struct State {
        var replies: Deque<Reply> = []
        var wakeScheduled = false
        var stopRequested = false
    }

    public let configuration: Configuration
    private let router: BusRouter
    private let logger: Logger
    private let context: ZMQContext
    private let state = Mutex(State())
    private let wakeup: Wakeup
    private let executor: IOThreadExecutor
    private let metrics = BusServerMetrics()

    public init(configuration: Configuration, router: BusRouter, context: ZMQContext = .shared, logger: Logger) {
        self.configuration = configuration
        self.router = router
        self.context = context
        self.logger = logger
        self.wakeup = Wakeup()
        self.executor = IOThreadExecutor(wakeup: wakeup)
        metrics.prepare(methods: router.methods)
    }

    /// Binds and serves until cancelled or shut down gracefully; throws if the bind fails.
    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await withTaskCancellationHandler {
                try await IOThread.run(name: "bus-server") { [self] in ioLoop() }.get()
            } onCancel: {
                requestStop()
            }
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// Asks the server to drain and stop; `run()` returns once the requests in progress are answered.
    public func requestStop() {
        state.withLock { $0.stopRequested = true }
        wakeup.signal()
    }

    private func enqueue(_ reply: Reply) {
        let wake = state.withLock { state -> Bool in
            state.replies.append(reply)
            defer { state.wakeScheduled = true }
            return !state.wakeScheduled
        }
        if wake && !executor.isCurrentThread { wakeup.signal() }
    }

    // MARK: The I/O thread

    private func ioLoop() -> Result<Void, ZMQError> {
        executor.adoptCurrentThread()
        let socket: ZMQSocket
        do {
            socket = try ZMQSocket(.router, context: context)
            try socket.setLinger(milliseconds: configuration.lingerMilliseconds)
            try socket.setHighWaterMarks(send: configuration.highWaterMark, receive: configuration.highWaterMark)
            try socket.setMaxMessageSize(configuration.maxMessageBytes)
            try socket.setHeartbeat(interval: 1000, timeout: 3000)
            if let key = configuration.curveSecretKey {
                if configuration.knownCallers {
                    try socket.setZAPDomain(BusAuthentication.busDomain)
                    socket.readsUserId = true
                }
                try socket.setCurveServer(secretKey: key)
            }
            try socket.bind(configuration.endpoint)
        } catch {
            logger.error("cannot bind", metadata: ["endpoint": "\(configuration.endpoint)", "error": "\(error)"])
            return .failure(error)
        }
        logger.info("listening", metadata: ["endpoint": "\(configuration.endpoint)", "max-in-flight": "\(configuration.maxInFlight)"])

        var poller = ZMQPoller()
        poller.addReadable(socket)
        let wakeIndex = poller.addReadable(fileDescriptor: wakeup.fileDescriptor)
        var inFlight = 0
        var draining = false
        // The replies taken from `state` each turn: swapped with its buffer, so that neither is
        // copied nor allocated again (taking a copy and emptying the shared one copied every
        // reply: `Deque.removeAll(keepingCapacity:)` makes its storage unique first).
        var replies = Deque<Reply>()

        while true {
            do {
                _ = try poller.poll(timeoutMilliseconds: executor.hasJobs ? 0 : draining ? 100 : -1)
            } catch {
                logger.error("zmq_poll failed", metadata: ["error": "\(error)"])
                break
            }
            if poller.isReadable(wakeIndex) { wakeup.drain() }
            let stopRequested = state.withLock { state in
                state.wakeScheduled = false
                swap(&replies, &state.replies)
                return state.stopRequested
            }
            inFlight -= replies.count
            send(replies, on: socket)
            replies.removeAll(keepingCapacity: true)
            if stopRequested && !draining {
                draining = true
                logger.info("draining", metadata: ["in-flight": "\(inFlight)"])
            }
            // Read what is waiting, a bounded number of messages at a time so replies are not held
            // back; refusals (malformed, expired, overloaded) go out with this turn's replies.
            var refusals: [Reply] = []
            for _ in 0..<256 {
                let received: ZMQSocket.ReceivedMessage?
                do {
                    received = try socket.receive(maxFrames: 1 + 2 * WireFormat.maxBatch)
                } catch {
                    logger.error("zmq receive failed", metadata: ["error": "\(error)"])
                    break
                }
                guard let received else { break }
                admit(received, on: socket, inFlight: &inFlight, draining: draining, refusals: &refusals)
            }
            // Run the handlers just admitted (and any resumed): most finish here and now.
            executor.runQueuedJobs()
            state.withLock { swap(&replies, &$0.replies) }
            inFlight -= replies.count
            replies.prepend(contentsOf: refusals)  // (never in flight)
            send(replies, on: socket)
            replies.removeAll(keepingCapacity: true)
            if draining && inFlight == 0 { break }
        }
        socket.close()
        logger.info("stopped", metadata: ["endpoint": "\(configuration.endpoint)"])
        return .success(())
    }

    /// Admits each request of a message (one, or a batch): its handler starts as a task on this
    /// thread's executor, or its refusal is added to `refusals`.
    private func admit(_ received: ZMQSocket.ReceivedMessage, on socket: ZMQSocket, inFlight: inout Int, draining: Bool, refusals: inout [Reply]) {
        let frames: [[UInt8]]
        let truncated: Bool
        switch received {
        case .frames(let all): frames = all; truncated = false
        case .truncated(let first): frames = first; truncated = true
        }
        guard frames.count >= 2 else {
            logger.debug("dropped a message with too few frames")
            return
        }
        let identity = frames[0]
        let callerRole = socket.readsUserId ? BusRole(rawValue: socket.lastUserId ?? "") : nil
        guard !truncated, let pairs = WireFormat.pairs(frames[1...]) else {
            // Every request whose id can be read hears why none of the message was handled.
            let reason = truncated
                ? "a batch holds at most \(WireFormat.maxBatch) requests"
                : "a request is a header frame and a body frame (a batch, pairs of them)"
            var refused = 0
            for frame in frames.dropFirst() {
                switch WireFormat.decodeRequest(frame) {
                case .success(let header):
                    refusals.append(Reply(identity: identity, requestId: header.requestId, encoding: header.encoding,
                                          result: .failure(BusError(.badRequest, reason))))
                    refused += 1
                case .failure(.malformed(let requestId, _)):
                    refusals.append(Reply(identity: identity, requestId: requestId, encoding: .binary,
                                          result: .failure(BusError(.badRequest, reason))))
                    refused += 1
                case .failure(.unreadable):
                    continue
                }
            }
            if refused == 0 { logger.debug("dropped a message whose frames do not pair up") }
            return
        }
        let batched = pairs.count > 1
        for (headerBytes, body) in pairs {
            let header: WireFormat.RequestHeader
            switch WireFormat.decodeRequest(headerBytes) {
            case .failure(.unreadable):
                logger.debug("dropped a message without a readable header")
                continue
            case .failure(.malformed(let requestId, let reason)):
                refusals.append(Reply(identity: identity, requestId: requestId, encoding: .binary,
                                      result: .failure(BusError(.badRequest, reason)), batched: batched))
                continue
            case .success(let decoded):
                header = decoded
            }
            switch admission(of: header, inFlight: inFlight, draining: draining) {
            case .handle:
                inFlight += 1
                start(header, body: body, identity: identity, callerRole: callerRole, batched: batched)
            case .drop:
                continue
            case .refuse(let error):
                refusals.append(Reply(identity: identity, requestId: header.requestId, encoding: header.encoding,
                                      result: .failure(error), batched: batched))
            }
        }
    }

    private enum Admission {
        case handle
        /// Unanswered: nobody waits for it.
        case drop
        case refuse(BusError)
    }

    /// Whether `header`'s request is handled now, and if not, why.
    private func admission(of header: WireFormat.RequestHeader, inFlight: Int, draining: Bool) -> Admission {
        if header.deadlineMilliseconds < BusCodec.nowMilliseconds() {
            // Nobody waits for this reply any more (it sat in a queue while we were down).
            logger.debug("dropped an expired request", metadata: ["method": "\(header.method)", "request-id": "\(header.traceId)"])
            return .drop
        }
        if draining {
            return .refuse(BusError(.unavailable, "service is shutting down"))
        }
        if inFlight >= configuration.maxInFlight {
            let method = router.knows(header.method) ? header.method : "unknown"
            Counter(label: "bus_overloaded_total", dimensions: [("method", method)]).increment()
            metrics.answered(method: method, code: BusError.Code.overloaded.rawValue, after: nil)
            return .refuse(BusError(.overloaded, "\(configuration.maxInFlight) requests already in progress"))
        }
        return .handle
    }

    /// Runs one request's handler as a task on this thread's executor; its reply is queued.
    private func start(_ header: WireFormat.RequestHeader, body: [UInt8], identity: [UInt8], callerRole: BusRole?, batched: Bool) {
        BusServerMetrics.inProgress.increment()
        let requestContext = BusRequestContext(
            method: header.method,
            traceId: header.traceId,
            deadlineMilliseconds: header.deadlineMilliseconds,
            callerRole: callerRole,
            logger: logger
        )
        Task(executorPreference: executor) { [router, metrics, debug = logger.logLevel <= .debug] in
            let started = ContinuousClock.now
            // (An envelope's deadline is whatever the caller wrote: at most an hour is taken.)
            let deadline = started.advanced(by: .milliseconds(min(header.deadlineMilliseconds - BusCodec.nowMilliseconds(), 3_600_000)))
            let result = await BusTrace.$id.withValue(header.traceId) {
                await BusDeadline.$current.withValue(deadline) {
                    await BusTracing.handle(router.knows(header.method) ? header.method : "unknown", traceParent: header.traceContext) {
                        await router.handle(method: header.method, body: body, encoding: header.encoding, context: requestContext)
                    }
                }
            }
            let elapsed = started.duration(to: .now)
            let method = router.knows(header.method) ? header.method : "unknown"
            BusServerMetrics.inProgress.decrement()
            switch result {
            case .success:
                metrics.answered(method: method, code: "ok", after: elapsed)
                if debug {
                    requestContext.logger.debug("handled", metadata: ["duration-us": "\(elapsed.wholeMicroseconds)"])
                }
            case .failure(let error):
                metrics.answered(method: method, code: error.code.rawValue, after: elapsed)
                if debug {
                    requestContext.logger.debug("failed", metadata: ["code": "\(error.code.rawValue)", "duration-us": "\(elapsed.wholeMicroseconds)"])
                }
            }
            self.enqueue(Reply(identity: identity, requestId: header.requestId, encoding: header.encoding, result: result, batched: batched))
        }
    }

    /// Sends `replies`: those to requests that came in batches grouped by caller, up to
    /// `WireFormat.maxBatch` in a message, the others one a message.
    private func send(_ replies: some Collection<Reply>, on socket: ZMQSocket) {
        guard !replies.isEmpty else { return }
        var callers: [[UInt8]] = []
        var batches: [[UInt8]: [[UInt8]]] = [:]
        for reply in replies {
            guard reply.batched else {
                var frames = [reply.identity]
                append(reply, to: &frames)
                send(frames, on: socket)
                continue
            }
            if batches[reply.identity] == nil { callers.append(reply.identity) }
            append(reply, to: &batches[reply.identity, default: [reply.identity]])
            if let frames = batches[reply.identity], frames.count > 2 * WireFormat.maxBatch {
                send(frames, on: socket)
                batches[reply.identity] = [reply.identity]
            }
        }
        for caller in callers {
            if let frames = batches[caller], frames.count > 1 { send(frames, on: socket) }
        }
    }

    /// Appends `reply`'s header and body to `frames`.
    private func append(_ reply: Reply, to frames: inout [[UInt8]]) {
        switch reply.result {
        case .success(let body):
            frames.append(WireFormat.encodeReplyHeader(requestId: reply.requestId, kind: .reply, encoding: reply.encoding))
            frames.append(body)
        case .failure(let error):
            frames.append(WireFormat.encodeReplyHeader(requestId: reply.requestId, kind: .error, encoding: reply.encoding))
            frames.append(BusCodec.encode(error: error, as: reply.encoding))
        }
    }

    private func send(_ frames: [[UInt8]], on socket: ZMQSocket) {
        do {
            try socket.send(frames)
        } catch {
            // A full queue to that caller, or a caller gone: it will time out; never block here.
            logger.warning("reply dropped", metadata: ["error": "\(error)"])
        }
    }
}

/// The bus server's metrics (recorded through swift-metrics: nothing unless the process
/// bootstrapped a metrics backend). Methods a service does not have count as `unknown`, so
/// garbage cannot grow the number of series. The handles of each method are made once and kept:
/// making one looks it up in the backend's registry, under its lock, by label and dimensions.
final class BusServerMetrics: Sendable {
    /// Requests being handled now.
    static let inProgress = Meter(label: "bus_requests_in_progress")

    private struct Handles {
        let duration: Metrics.Timer
        var answers: [String: Counter] = [:]
    }

    /// By method; bounded by the router's methods plus `unknown`, and each by the error codes.
    private let handles = Mutex<[String: Handles]>([:])

    /// Makes the series of each of `methods` at zero (its `ok` answers, its handler time, its
    /// overloaded answers), so that a scrape right after the start has them: `rate()` is 0,
    /// not absent.
    func prepare(methods: [String]) {
        for method in methods {
            _ = handles(method: method, code: "ok")
            _ = Counter(label: "bus_overloaded_total", dimensions: [("method", method)])
        }
        _ = Self.inProgress
    }

    /// Counts an answer by method and code (`ok`, or the error code), and the handler's time if
    /// it ran.
    func answered(method: String, code: String, after elapsed: Duration?) {
        let (counter, timer) = handles(method: method, code: code)
        counter.increment()
        if let elapsed { timer.record(elapsed) }
    }

    private func handles(method: String, code: String) -> (Counter, Metrics.Timer) {
        handles.withLock { handles -> (Counter, Metrics.Timer) in
            if handles[method] == nil {
                handles[method] = Handles(duration: Metrics.Timer(label: "bus_handler_duration_seconds", dimensions: [("method", method)]))
            }
            if let counter = handles[method]!.answers[code] { return (counter, handles[method]!.duration) }
            let counter = Counter(label: "bus_requests_total", dimensions: [("method", method), ("code", code)])
            handles[method]!.answers[code] = counter
            return (counter, handles[method]!.duration)
        }
    }
}
