import DequeModule
import Foundation
import HeapModule
import Logging
import Messages
import NIOCore
import ServiceLifecycle
import Synchronization
import Threads
import ZeroMQ

/// A caller of one service: a DEALER socket connected to the service's endpoint, owned by a
/// dedicated I/O thread, with many requests in flight matched by request id.
///
/// Calls never block the cooperative pool: a call queues its frames, wakes the I/O thread through
/// an eventfd and suspends until the reply, its deadline, or cancellation.
///
/// The I/O thread lives inside `run()`, as postgres-nio's `PostgresClient.run()` holds its
/// connections: run it as a service of the process's `ServiceGroup` (listed before the services
/// that call through it, so that it stops after them), or scope a client with
/// `withBusClient(_:body:)`. Calls made before `run()` starts wait for it; calls after it ended
/// fail `unavailable`.
public final class BusClient: Sendable, Service {
    /// How a client connects and how much it may hold.
    public struct Configuration: Sendable {
        /// The service's endpoint, such as `tcp://127.0.0.1:7101`, `ipc:///tmp/quota` or
        /// `inproc://quota`; or its replicas' endpoints, separated by commas: calls are spread
        /// over those connected (libzmq's DEALER sends to its peers in turn), and a retry-safe
        /// call whose connection broke is sent again, to another.
        public var endpoint: String
        /// Each endpoint of `endpoint`.
        public var endpoints: [String] {
            endpoint.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        /// The deadline of a call that names none.
        public var defaultTimeout: Duration
        /// The most calls waiting for replies at once; past it a call fails `overloaded` at once.
        public var maxInFlight: Int
        /// libzmq's queue limit for unsent requests (`ZMQ_SNDHWM`).
        public var sendHighWaterMark: Int32
        /// The largest reply accepted, in bytes; a larger one drops the connection.
        public var maxMessageBytes: Int64
        /// CURVE keys; nil for a plain connection.
        public var curve: CurveClientKeys?
        /// How request bodies are written (replies come back the same way): binary, or JSON to
        /// read them when debugging. A process reads it from `BUS_ENCODING` with its configuration.
        public var encoding: BusEncoding

        public init(
            endpoint: String,
            defaultTimeout: Duration = .seconds(5),
            maxInFlight: Int = 10_000,
            sendHighWaterMark: Int32 = 10_000,
            maxMessageBytes: Int64 = 4 << 20,
            curve: CurveClientKeys? = nil,
            encoding: BusEncoding = .binary
        ) {
            self.encoding = encoding
            self.endpoint = endpoint
            self.defaultTimeout = defaultTimeout
            self.maxInFlight = maxInFlight
            self.sendHighWaterMark = sendHighWaterMark
            self.maxMessageBytes = maxMessageBytes
            self.curve = curve
        }
    }

    /// What a call hears back before its body is decoded.
    enum Outcome: Sendable {
        case reply([UInt8], BusEncoding)
        case failure(BusError)
    }

    private struct Pending {
        var continuation: CheckedContinuation<Outcome, Never>
    }

    struct Outgoing {
        var id: UInt64
        var deadline: ContinuousClock.Instant
        var header: [UInt8]
        var body: [UInt8]
    }

    private struct State {
        var nextId: UInt64 = 1
        var pending: [UInt64: Pending] = [:]
        var outbox: Deque<Outgoing> = []
        var wakeScheduled = false
        var started = false
        var stopping = false
        var stopped = false
    }

    struct Timer: Comparable {
        var deadline: ContinuousClock.Instant
        var id: UInt64
        /// Sent while no connection to the service was up (it was down or starting): libzmq
        /// queued it for the reconnection. Unanswered at its deadline, the call fails
        /// `connection_lost`, not `timeout`: the service could not be reached (the gateway
        /// answers 503 with `Retry-After`, not 504), and, as with a timeout, the request may or
        /// may not have been handled (it may have gone out once the service came back).
        var unreached = false
        static func < (lhs: Timer, rhs: Timer) -> Bool { lhs.deadline < rhs.deadline }
    }

    public let configuration: Configuration
    /// How many endpoints `configuration` names (replicas), read once.
    private let replicas: Int
    private let state = Mutex(State())
    private let wakeup: Wakeup
    private let executor: IOThreadExecutor
    let context: ZMQContext
    private let lanes = EventLoopLanes()
    let logger: Logger

    /// A client of `configuration.endpoint`; it connects when `run()` starts.
    public init(configuration: Configuration, context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.client")) {
        self.configuration = configuration
        self.replicas = max(1, configuration.endpoints.count)
        self.context = context
        self.logger = logger
        self.wakeup = Wakeup()
        self.executor = IOThreadExecutor(wakeup: wakeup)
    }

    /// Connects and serves calls on an I/O thread of its own until the task is cancelled or the
    /// service group shuts down gracefully; then calls still waiting fail with `unavailable`. A
    /// second `run()` returns at once.
    public func run() async {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await IOThread.run(name: "bus-client") { [self] in ioLoop() }
                await lanes.closeAll()
            } onCancel: {
                requestStop()
            }
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// The executor of this client's I/O thread. A task that prefers it (`Task(executorPreference:)`
    /// or `withTaskExecutorPreference`) makes its calls without a thread hop: the request is sent
    /// and the reply resumes it on the I/O thread. Such a task must not block.
    public var taskExecutor: any TaskExecutor { executor }

    /// Calls `method` with `request` and waits for its reply, at most `timeout` (the configured
    /// default if nil). Fails with a `BusError`: the service's own, or `timeout`, `overloaded`,
    /// `unavailable`, `bad_reply` or `cancelled`.
    public func call<Request, Reply>(
        _ method: BusMethod<Request, Reply>,
        _ request: Request,
        timeout: Duration? = nil
    ) async throws(BusError) -> Reply {
        let body: [UInt8]
        do {
            body = try BusCodec.encode(request, as: configuration.encoding)
        } catch {
            throw BusError(.badRequest, "cannot encode \(Request.self): \(error)")
        }
        let deadline = ContinuousClock.now.advanced(by: timeout ?? configuration.defaultTimeout)
        return try await BusTracing.call(method.name) { traceContext -> Result<Reply, BusError> in
            var outcome = await send(method: method.name, body: body, timeout: ContinuousClock.now.duration(to: deadline), traceContext: traceContext)
            // A replica died with the call in flight, or answered that it cannot serve now (its
            // database out of its reach: nothing was done): a retry-safe call goes again (to
            // another replica, if the endpoint names several), within the same deadline. Not when
            // this client itself cannot send (`unavailable` and not retryable: it cannot connect).
            // A retry that runs out of the deadline ends the call with the failure it was sent
            // after, not `timeout`: the service was reached and said why it could not serve (a
            // replica cut off from its database answers `unavailable` just before the deadline,
            // and the retry, with what was left, timed out: a 504 instead of the 503 the answer
            // meant, in `make hosts-chaos`, partition-leader-host-from-db).
            var retries = 0
            var retriedAfter: BusError?
            while case .failure(let error) = outcome, error.code == .connectionLost || (error.code == .unavailable && error.retryable),
                  method.retrySafe, retries < Self.maxRetries, ContinuousClock.now < deadline {
                retries += 1
                retriedAfter = error
                outcome = await send(method: method.name, body: body, timeout: ContinuousClock.now.duration(to: deadline), traceContext: traceContext)
            }
            // (Out of time: a timeout, or a retry that found no connection by the deadline.)
            if case .failure(let error) = outcome, let retriedAfter,
               error.code == .timeout || (error.code == .connectionLost && ContinuousClock.now >= deadline) {
                outcome = .failure(retriedAfter)
            }
            switch outcome {
            case .failure(let error):
                return .failure(error)
            case .reply(let bytes, let encoding):
                do {
                    return .success(try BusCodec.decode(Reply.self, from: bytes, as: encoding))
                } catch {
                    return .failure(BusError(.badReply, "\(method.name): reply is not a \(Reply.self): \(error)"))
                }
            }
        }.get()
    }

    /// How many times a retry-safe call is sent again after `connection_lost` or `unavailable`.
    static let maxRetries = 2

    /// Sends already-encoded frames; the seam `call` and tests of raw bodies share.
    func send(method: String, body: [UInt8], encoding: BusEncoding? = nil, timeout: Duration, traceContext: String = "") async -> Outcome {
        let encoding = encoding ?? configuration.encoding
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let header = { (id: UInt64) in
            WireFormat.encodeRequest(.init(
                encoding: encoding,
                requestId: id,
                deadlineMilliseconds: BusCodec.nowMilliseconds() + timeout.wholeMilliseconds,
                method: method,
                traceId: BusTrace.id,
                traceContext: traceContext
            ))
        }
        guard (1...255).contains(method.utf8.count) else {
            return .failure(BusError(.badRequest, "method name must be 1 to 255 bytes"))
        }
        let id = state.withLock { state -> UInt64 in
            defer { state.nextId &+= 1 }
            return state.nextId
        }
        // On an event loop, the loop's own socket sends it now (`EventLoopLane`).
        let lane = lanes.current(for: self)
        let item = Outgoing(id: id, deadline: deadline, header: header(id), body: body)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Outcome, Never>) in
                let (refusal, wake) = state.withLock { state -> (BusError?, Bool) in
                    if state.stopping || state.stopped {
                        return (BusError(.unavailable, "bus client for \(configuration.endpoint) is shut down"), false)
                    }
                    if state.pending.count >= configuration.maxInFlight {
                        return (BusError(.overloaded, "\(configuration.maxInFlight) calls to \(configuration.endpoint) already in flight"), false)
                    }
                    if Task.isCancelled {
                        return (BusError(.cancelled, "call cancelled"), false)
                    }
                    state.pending[id] = Pending(continuation: continuation)
                    if lane != nil { return (nil, false) }
                    return (nil, Self.queue(item, in: &state))
                }
                if let refusal {
                    continuation.resume(returning: .failure(refusal))
                } else if let lane {
                    if !lane.send(item) { handOver(item) }
                } else if wake && !executor.isCurrentThread {
                    wakeup.signal()
                }
            }
        } onCancel: {
            finish(id, with: .failure(BusError(.cancelled, "call cancelled")))
        }
    }

    /// Queues `item` for the I/O thread; whether the thread must be woken.
    private static func queue(_ item: Outgoing, in state: inout State) -> Bool {
        state.outbox.append(item)
        defer { state.wakeScheduled = true }
        return !state.wakeScheduled
    }

    /// Gives the I/O thread a call a lane could not send (see `EventLoopLane.send`).
    private func handOver(_ item: Outgoing) {
        let wake = state.withLock { state -> Bool? in
            guard !state.stopping, !state.stopped else { return nil }
            return Self.queue(item, in: &state)
        }
        switch wake {
        case nil: finish(item.id, with: .failure(BusError(.unavailable, "bus client for \(configuration.endpoint) is shut down")))
        case true?: wakeup.signal()
        case false?: break
        }
    }

    /// Opens this client's socket on each loop of `group` now, rather than at each loop's first
    /// call, so that the process holds the same connections from its start. Calls made on those
    /// loops once the client runs go out through them (`EventLoopLane`); they close when `run()`
    /// ends.
    public func openLanes(on group: any EventLoopGroup) {
        for loop in group.makeIterator() {
            loop.execute { [self] in _ = lanes.current(for: self) }
        }
    }

    /// Whether `run()` has started and is not stopping: calls made before wait for it in the I/O
    /// thread's queue, not in a lane.
    var isRunning: Bool { state.withLock { $0.started && !$0.stopping } }

    /// How many event loops have a socket of this client (`EventLoopLane`).
    var openLanes: Int { lanes.count }

    /// Asks the I/O thread to stop; `run()` returns once it has.
    private func requestStop() {
        state.withLock { $0.stopping = true }
        wakeup.signal()
    }

    /// Resumes the call `id` with `outcome` if it is still waiting.
    func finish(_ id: UInt64, with outcome: Outcome) {
        let pending = state.withLock { $0.pending.removeValue(forKey: id) }
        pending?.continuation.resume(returning: outcome)
    }

    // MARK: The I/O thread

    private func ioLoop() {
        executor.adoptCurrentThread()
        // With its monitor: disconnections, so that calls already sent to a service that died
        // fail at once (`connection_lost`) instead of at their deadline (without a monitor, only
        // the deadline), and handshakes (`Timer.unreached`).
        let socket: ZMQSocket
        let monitor: ZMQSocket?
        do {
            (socket, monitor) = try openSocket()
        } catch {
            logger.error("bus client cannot connect", metadata: ["endpoint": "\(configuration.endpoint)", "error": "\(error)"])
            stop(reason: BusError(.unavailable, "cannot connect to \(configuration.endpoint): \(error)", retryable: false))
            return
        }
        var poller = ZMQPoller()
        poller.addReadable(socket)
        let wakeIndex = poller.addReadable(fileDescriptor: wakeup.fileDescriptor)
        let monitorIndex = monitor.map { poller.addReadable($0) }
        var timers = Heap<Timer>()
        var unsent = Deque<Outgoing>()
        var lost = LostConnections(endpoints: configuration.endpoints, monitored: monitor != nil)

        var stopping = false
        var busy = false
        // The calls taken from `state` each turn: swapped with its outbox, so that neither is
        // copied nor allocated again (`Deque.removeAll(keepingCapacity:)` on a shared deque
        // copies every element first).
        var batch = Deque<Outgoing>()

        while true {
            var timeout = busy ? 0 : timers.min.map { Self.milliseconds(until: $0.deadline) } ?? -1
            // Requests no replica could take yet are tried again every few milliseconds.
            if !unsent.isEmpty { timeout = timeout < 0 ? Self.unsentRetryMilliseconds : min(timeout, Self.unsentRetryMilliseconds) }
            if let check = lost.nextCheck {
                let until = Self.milliseconds(until: check)
                timeout = timeout < 0 ? until : min(timeout, until)
            }
            do {
                _ = try poller.poll(timeoutMilliseconds: timeout)
            } catch {
                logger.error("zmq_poll failed", metadata: ["error": "\(error)"])
                break
            }
            if poller.isReadable(wakeIndex) { wakeup.drain() }

            // Callers on this thread's executor run here; what they send goes out in this turn.
            executor.runQueuedJobs()
            stopping = state.withLock { state in
                state.wakeScheduled = false
                swap(&batch, &state.outbox)
                return state.stopping
            }
            if !unsent.isEmpty {
                var waiting = Deque<Outgoing>()
                swap(&waiting, &unsent)
                let live = state.withLock { state in waiting.filter { state.pending[$0.id] != nil } }  // not cancelled meanwhile
                unsent.append(contentsOf: sendRequests(live, on: socket, connected: lost.connected, timers: &timers))
            }
            unsent.append(contentsOf: sendRequests(batch, on: socket, connected: lost.connected, timers: &timers))
            batch.removeAll(keepingCapacity: true)
            receiveReplies(on: socket)
            if let monitor, let monitorIndex {
                // Replies that arrived before the disconnection were read just above.
                if lost.confirmed(monitor: poller.isReadable(monitorIndex) ? monitor : nil, socket: socket) { failSent(&timers) }
            }
            executor.runQueuedJobs()
            busy = executor.hasJobs || state.withLock { !$0.outbox.isEmpty }

            expire(&timers)
            if stopping { break }
        }
        Self.close(socket, monitor: monitor)
        stop(reason: BusError(.unavailable, "bus client for \(configuration.endpoint) is shut down"))
    }

    /// A DEALER socket with this client's options, connected to its endpoints, and its monitor
    /// (`monitor(_:logger:)`); on the thread that will use it (the I/O thread, or an event loop's
    /// lane). A handshake done before the monitor listened is not heard: the socket is taken for
    /// unconnected until its next handshake, and its calls' timeouts come back as
    /// `connection_lost` (both 503 and 504 say "try again"; a monitor made before the connections
    /// made the bus tests' module twice as slow, with calls that never went out, for reasons not
    /// found).
    func openSocket() throws(ZMQError) -> (socket: ZMQSocket, monitor: ZMQSocket?) {
        let socket = try ZMQSocket(.dealer, context: context)
        try socket.setLinger(milliseconds: 0)
        try socket.setHighWaterMarks(send: configuration.sendHighWaterMark, receive: configuration.sendHighWaterMark)
        try socket.setMaxMessageSize(configuration.maxMessageBytes)
        try socket.setReconnect(interval: 100, maximum: 1000)
        try socket.setHeartbeat(interval: 1000, timeout: 3000)
        if let curve = configuration.curve {
            try socket.setCurveClient(serverKey: curve.serverPublicKey, publicKey: curve.publicKey, secretKey: curve.secretKey)
        }
        // Replicas: nothing is queued for one that is down (the others take the calls); a
        // single service's calls wait for it to come back, as before.
        if configuration.endpoints.count > 1 { try socket.setImmediate(true) }
        var monitor: ZMQSocket?
        do {
            for endpoint in configuration.endpoints { try socket.connect(endpoint) }
            monitor = Self.monitor(socket, logger: logger)
        } catch {
            Self.close(socket, monitor: monitor)
            throw error
        }
        return (socket, monitor)
    }

    /// Closes `socket` and its monitor, in this order: the monitor stopped first, since an event
    /// sent to a closed reader would block libzmq's I/O thread.
    static func close(_ socket: ZMQSocket, monitor: ZMQSocket?) {
        if monitor != nil { socket.stopMonitor() }
        socket.close()
        monitor?.close()
    }

    /// A PAIR socket that hears `socket`'s connections and disconnections; nil if the monitor
    /// cannot be set up.
    static func monitor(_ socket: ZMQSocket, logger: Logger) -> ZMQSocket? {
        do {
            return try socket.openMonitor("bus-client", events: [.disconnected, .connectRetried, .handshakeSucceeded])
        } catch {
            logger.warning("bus client cannot monitor its connection; lost calls wait for their deadline", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// Fails the calls of `timers` whose deadline has passed as `timeout`, or as `connection_lost`
    /// those sent while no connection was up (`Timer.unreached`). Timers of answered calls are
    /// dropped lazily: the heap is rebuilt once they outnumber live calls. Shared by the I/O
    /// thread and the event loops' lanes, each with the heap of the calls it sent.
    func expire(_ timers: inout Heap<Timer>) {
        let now = ContinuousClock.now
        while let first = timers.min, first.deadline <= now {
            timers.removeMin()
            let error = first.unreached
                ? Self.unreached(configuration.endpoint)
                : BusError(.timeout, "no reply from \(configuration.endpoint) within the deadline")
            finish(first.id, with: .failure(error))
        }
        let live = state.withLock { $0.pending.count }
        if timers.count > 4 * live + 1024 {
            let ids = state.withLock { Set($0.pending.keys) }
            timers = Heap(timers.unordered.filter { ids.contains($0.id) })
        }
    }

    /// A call's failure at its deadline when no connection was up as it was to be sent.
    static func unreached(_ endpoint: String) -> BusError {
        BusError(.connectionLost, "no connection to \(endpoint) when the call was made (the service was down or starting), and no reply within the deadline; the request may or may not have been handled")
    }

    /// The connection broke: every call already sent will not be answered. They fail now as
    /// `connection_lost`; calls sent from here on wait for the reconnection.
    func failSent(_ timers: inout Heap<Timer>) {
        let sent = timers.unordered.map(\.id)
        timers = Heap()
        guard !sent.isEmpty else { return }
        logger.debug("connection lost with calls in flight", metadata: ["endpoint": "\(configuration.endpoint)", "calls": "\(sent.count)"])
        for id in sent {
            finish(id, with: .failure(BusError(.connectionLost, "the connection to \(configuration.endpoint) broke before the reply; the request may or may not have been handled")))
        }
    }

    /// How often requests no replica could take yet are tried again.
    static let unsentRetryMilliseconds = 5

    /// Sends a request, or finishes its call with why it cannot be sent. False when it should be
    /// tried again: replicas (`ZMQ_IMMEDIATE`) with none connected yet take nothing, and such a
    /// request waits for one (until its deadline), as a single service's requests wait in libzmq's
    /// queue for it to come up.
    func sendRequest(_ item: Outgoing, on socket: ZMQSocket, connected: Bool, timers: inout Heap<Timer>) -> Bool {
        sendRequests(CollectionOfOne(item), on: socket, connected: connected, timers: &timers).isEmpty
    }

    /// Sends `items` in batches of up to `WireFormat.maxBatch` requests a message, finishing each
    /// call that cannot be sent with why; returns those to try again (see `sendRequest`). One
    /// replica takes a whole message, so with several endpoints the items are split in as many
    /// messages as there are endpoints (libzmq hands each message to the next connected replica):
    /// calls made together still spread over the replicas. `connected`: whether a connection of
    /// `socket` is up (`LostConnections.connected`); see `Timer.unreached`.
    func sendRequests(_ items: some Collection<Outgoing>, on socket: ZMQSocket, connected: Bool, timers: inout Heap<Timer>) -> [Outgoing] {
        guard !items.isEmpty else { return [] }
        let now = ContinuousClock.now
        let batchSize = min(WireFormat.maxBatch, (items.count + replicas - 1) / replicas)
        var retry: [Outgoing] = []
        var batch: [Outgoing] = []
        var frames: [[UInt8]] = []
        batch.reserveCapacity(batchSize)
        frames.reserveCapacity(2 * batchSize)
        func flush() {
            defer { batch.removeAll(keepingCapacity: true); frames.removeAll(keepingCapacity: true) }
            do {
                try socket.send(frames)
                for item in batch { timers.insert(Timer(deadline: item.deadline, id: item.id, unreached: !connected)) }
            } catch ZMQError.wouldBlock {
                if replicas > 1 { retry.append(contentsOf: batch); return }
                for item in batch {
                    finish(item.id, with: .failure(BusError(.overloaded, "cannot queue for \(configuration.endpoint): its send queue is full, or the connection was refused (a failed handshake is not retried)")))
                }
            } catch {
                for item in batch { finish(item.id, with: .failure(BusError(.unavailable, "cannot send to \(configuration.endpoint): \(error)"))) }
            }
        }
        for item in items {
            guard item.deadline > now else {
                finish(item.id, with: .failure(connected
                    ? BusError(.timeout, "deadline passed before the request was sent")
                    : Self.unreached(configuration.endpoint)))
                continue
            }
            batch.append(item)
            frames.append(item.header)
            frames.append(item.body)
            if batch.count == batchSize { flush() }
        }
        if !batch.isEmpty { flush() }
        return retry
    }

    func receiveReplies(on socket: ZMQSocket) {
        while true {
            let received: ZMQSocket.ReceivedMessage?
            do {
                received = try socket.receive(maxFrames: 2 * WireFormat.maxBatch)
            } catch {
                logger.error("zmq receive failed", metadata: ["error": "\(error)"])
                return
            }
            guard let received else { return }
            guard case .frames(let frames) = received, let pairs = WireFormat.pairs(frames[...]) else {
                logger.warning("dropped a malformed reply", metadata: ["endpoint": "\(configuration.endpoint)"])
                continue
            }
            for (header, body) in pairs {
                guard let (id, kind, encoding) = WireFormat.decodeReplyHeader(header) else {
                    logger.warning("dropped a malformed reply", metadata: ["endpoint": "\(configuration.endpoint)"])
                    continue
                }
                if kind == .reply {
                    finish(id, with: .reply(body, encoding))
                } else {
                    let error = (try? BusCodec.decode(BusError.self, from: body, as: encoding))
                        ?? BusError(.badReply, "undecodable error reply")
                    finish(id, with: .failure(error))
                }
            }
        }
    }

    private func stop(reason: BusError) {
        let pending = state.withLock { state in
            state.stopped = true
            state.stopping = true
            let pending = state.pending
            state.pending.removeAll()
            state.outbox.removeAll()
            return pending
        }
        for call in pending.values { call.continuation.resume(returning: .failure(reason)) }
    }

    private static func milliseconds(until deadline: ContinuousClock.Instant) -> Int {
        let remaining = ContinuousClock.now.duration(to: deadline)
        guard remaining > .zero else { return 0 }
        return Int(remaining.wholeMilliseconds) + 1
    }
}

/// Runs a client of `configuration` for the duration of `body`: connected before `body` is called,
/// stopped (calls still waiting fail `unavailable`) when it returns or throws.
public func withBusClient<T>(
    _ configuration: BusClient.Configuration, context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.client"),
    isolation: isolated (any Actor)? = #isolation, _ body: (BusClient) async throws -> T
) async throws -> T {
    try await withBusClients([configuration], context: context, logger: logger, isolation: isolation) { try await body($0[0]) }
}

/// Runs a client of each configuration for the duration of `body`, in the order given.
public func withBusClients<T>(
    _ configurations: [BusClient.Configuration], context: ZMQContext = .shared, logger: Logger = Logger(label: "bus.client"),
    isolation: isolated (any Actor)? = #isolation, _ body: ([BusClient]) async throws -> T
) async throws -> T {
    let clients = configurations.map { BusClient(configuration: $0, context: context, logger: logger) }
    return try await whileRunning(isolation: isolation, {
        await withDiscardingTaskGroup { group in
            for client in clients { group.addTask { await client.run() } }
        }
    }) {
        try await body(clients)
    }
}

/// CURVE keys for a client: the server's public key and the client's own pair (32 bytes each).
/// Described with the public keys only, never the secret one (a configuration holding these may
/// be printed).
public struct CurveClientKeys: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    public var serverPublicKey: [UInt8]
    public var publicKey: [UInt8]
    public var secretKey: [UInt8]

    public init(serverPublicKey: [UInt8], publicKey: [UInt8], secretKey: [UInt8]) {
        self.serverPublicKey = serverPublicKey
        self.publicKey = publicKey
        self.secretKey = secretKey
    }

    public var description: String {
        "CurveClientKeys(server: \(ZMQCurveKeyPair.encode(serverPublicKey)), public: \(ZMQCurveKeyPair.encode(publicKey)), secret: hidden)"
    }
    public var debugDescription: String { description }
}

/// The disconnections a client's monitor reports, each taken as final only once libzmq has taken
/// the dead peer's pipe out of the socket's routing. libzmq reports a disconnection
/// (`ZMQ_EVENT_DISCONNECTED`) before it terminates the connection's pipe, and the socket learns
/// of the termination later still, from its command queue. A retry sent in between (the calls in
/// flight fail as `connection_lost` and retry-safe ones go again at once) could be routed into the
/// dying pipe and dropped with it, and then waited for its whole deadline: seen under load in the
/// replica test, whose 20 calls to a killed replica are all retried. The reconnection libzmq
/// schedules for the same endpoint (`ZMQ_EVENT_CONNECT_RETRIED`) comes after the pipe's
/// termination was queued to the socket; asking the socket's events then processes it. So calls
/// fail at that second event. Should it not come (an endpoint named differently in the two
/// events), they fail `grace` after the first, as before.
///
/// It also follows which endpoints are connected (their handshake done, not disconnected since),
/// so that a call sent with none up is known to wait for a reconnection (`BusClient.Timer`).
struct LostConnections {
    /// Endpoints reported disconnected, and since when.
    private var waiting: [String: ContinuousClock.Instant] = [:]
    /// Endpoints whose handshake succeeded and that have not disconnected since.
    private var up: Set<String> = []
    /// Taken for connected whatever is heard: a socket without a monitor (nothing is heard), or
    /// with an `inproc://` endpoint (it has no handshake to hear).
    private let alwaysConnected: Bool

    init(endpoints: [String], monitored: Bool = true) {
        alwaysConnected = !monitored || endpoints.contains { $0.hasPrefix("inproc://") }
    }

    /// Whether a connection is up: a call sent now goes to a peer rather than into libzmq's queue.
    var connected: Bool { alwaysConnected || !up.isEmpty }

    static let grace = Duration.seconds(1)

    /// When a disconnection waits to be taken as final without its second event.
    var nextCheck: ContinuousClock.Instant? { waiting.values.min().map { $0.advanced(by: Self.grace) } }

    /// Reads `monitor`'s events (nil: none waiting); true when the calls sent so far will not be
    /// answered, the dead peers' pipes being out of `socket`'s routing.
    mutating func confirmed(monitor: ZMQSocket?, socket: ZMQSocket, now: ContinuousClock.Instant = .now) -> Bool {
        var confirmed = false
        while let monitor, let message = try? monitor.receive(maxFrames: 2) {
            guard let (event, endpoint) = ZMQSocket.monitorEvent(message) else { continue }
            if event.contains(.handshakeSucceeded) {
                up.insert(endpoint)
            } else if event.contains(.disconnected) {
                up.remove(endpoint)
                if waiting[endpoint] == nil { waiting[endpoint] = now }
            } else if event.contains(.connectRetried) {
                up.remove(endpoint)
                if waiting.removeValue(forKey: endpoint) != nil { confirmed = true }
            }
        }
        let overdue = waiting.filter { now - $0.value >= Self.grace }
        if !overdue.isEmpty {
            for endpoint in overdue.keys { waiting.removeValue(forKey: endpoint) }
            confirmed = true
        }
        // Processes the socket's commands: the pipe's termination among them.
        if confirmed { _ = socket.isReadable }
        return confirmed
    }
}
