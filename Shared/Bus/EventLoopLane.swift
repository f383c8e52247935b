#if canImport(Glibc)
import Glibc
#endif
import Foundation
import HeapModule
import Logging
import Messages
import NIOCore
import NIOPosix
import Synchronization
import ZeroMQ

/// The lanes of one `BusClient`: a socket of its own on each NIO event loop that calls it.
///
/// A call made on an event loop (an HTTP handler of a gateway that runs its tasks on its event
/// loops) is sent from that loop's socket at once, and its reply is read there: libzmq's
/// readiness descriptor (`ZMQ_FD`) sits in the event loop's own selector, so the call crosses no
/// thread in this process. Calls made anywhere else go through the client's I/O thread as before.
final class EventLoopLanes: Sendable {
    private struct State {
        /// Each event loop's lane; nil for a loop whose lane could not open (it uses the I/O thread).
        var lanes: [ObjectIdentifier: EventLoopLane?] = [:]
        var closed = false
    }

    private let state = Mutex(State())

    /// The lane of the event loop the caller runs on, opened on first use; nil off an event loop,
    /// before the client runs, once the lanes are closed, or where a lane cannot work.
    func current(for client: BusClient) -> EventLoopLane? {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop, client.isRunning else { return nil }
        let key = ObjectIdentifier(loop)
        switch state.withLock({ $0.closed ? .some(nil) : $0.lanes[key] }) {
        case .some(let lane): return lane
        case .none: break
        }
        // Only this loop's thread opens its lane, so no other can race to insert it.
        let lane = EventLoopLane.open(on: loop, for: client)
        let kept = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.lanes[key] = .some(lane)
            return true
        }
        if !kept, let lane {
            lane.close()
            return nil
        }
        return lane
    }

    /// How many lanes are open.
    var count: Int { state.withLock { $0.lanes.values.count { $0.map { !$0.isClosed } ?? false } } }

    /// Closes every lane, each on its own event loop; no lane opens after this.
    func closeAll() async {
        let lanes = state.withLock { state -> [EventLoopLane] in
            state.closed = true
            defer { state.lanes.removeAll() }
            return state.lanes.values.compactMap { $0 }
        }
        for lane in lanes {
            if !lane.isClosed { lane.eventLoop.execute { lane.close() } }
            // A loop that has shut down runs nothing more, but closed the lane as it closed its
            // watchers. A loop that is alive and does not get to it in time is stuck: its
            // sockets are left to it rather than closed under it from here.
            if await !lane.closed(within: .seconds(2)) {
                lane.logStuck()
            }
        }
    }
}

/// One event loop's socket for a `BusClient`: requests sent and replies read on that loop.
///
/// libzmq's `ZMQ_FD` is an eventfd that libzmq's own I/O thread writes when the socket has news.
/// NIO watches it as an input-only pipe channel; NIO reads the eventfd's count when it fires, so
/// the lane writes the same count back at once (libzmq expects to read its own signal) and, once
/// the loop has handled the turn's I/O events, asks the socket for its events, which lets libzmq
/// consume the signal, and reads every reply.
final class EventLoopLane: @unchecked Sendable {
    // @unchecked: every stored `var` is read and written on `eventLoop` only.
    let eventLoop: any EventLoop
    private let client: BusClient
    private let socket: ZMQSocket
    private let monitor: ZMQSocket?
    private var watchers: [any Channel] = []
    /// The deadline of every call sent from here and not yet known answered (answered ones are
    /// dropped lazily, as the I/O thread does).
    private var timers = Heap<BusClient.Timer>()
    private var alarm: Scheduled<Void>?
    private var alarmDeadline: ContinuousClock.Instant?
    private var drainScheduled = false
    /// Set on `eventLoop` by `close()`; read from any thread.
    private let closedFlag = Atomic<Bool>(false)
    /// A watcher failed to register: the lane cannot hear replies and sends nothing more.
    private var broken = false
    /// Disconnections heard and not yet final, and whether a connection is up (`LostConnections`).
    private var lost: LostConnections

    /// How late past its deadline a call may be failed: deadlines are checked in rounds of this.
    static let alarmSlack = Duration.milliseconds(10)

    private init(eventLoop: any EventLoop, client: BusClient, socket: ZMQSocket, monitor: ZMQSocket?) {
        self.eventLoop = eventLoop
        self.client = client
        self.socket = socket
        self.monitor = monitor
        lost = LostConnections(endpoints: client.configuration.endpoints, monitored: monitor != nil)
    }

    /// Opens a socket for `client` on `loop` (the calling thread) and starts watching it; nil when
    /// it cannot, or when this libzmq does not signal through an eventfd (then the calls of this
    /// loop go through the client's I/O thread).
    static func open(on loop: any EventLoop, for client: BusClient) -> EventLoopLane? {
        func cannotOpen(_ error: any Error) -> EventLoopLane? {
            client.logger.warning("bus client cannot open an event loop's socket; its calls use the I/O thread", metadata: [
                "endpoint": "\(client.configuration.endpoint)", "error": "\(error)",
            ])
            return nil
        }
        let socket: ZMQSocket
        let monitor: ZMQSocket?
        let fd: Int32
        do {
            (socket, monitor) = try client.openSocket()
        } catch {
            return cannotOpen(error)
        }
        do {
            fd = try socket.fileDescriptor()
        } catch {
            BusClient.close(socket, monitor: monitor)
            return cannotOpen(error)
        }
        guard isEventFD(fd) else {
            client.logger.info("libzmq does not signal through an eventfd here; bus calls use the I/O thread")
            BusClient.close(socket, monitor: monitor)
            return nil
        }
        let lane = EventLoopLane(eventLoop: loop, client: client, socket: socket, monitor: monitor)
        lane.watch(fd)
        if let monitor, let monitorFD = try? monitor.fileDescriptor() { lane.watch(monitorFD) }
        return lane
    }

    /// Whether `fd` is an eventfd, whose count can be read and written back.
    private static func isEventFD(_ fd: Int32) -> Bool {
        var buffer = [CChar](repeating: 0, count: 64)
        let count = readlink("/proc/self/fd/\(fd)", &buffer, buffer.count - 1)
        guard count > 0 else { return false }
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self) == "anon_inode:[eventfd]"
    }

    /// Has NIO watch a duplicate of libzmq's `fd` on this loop.
    private func watch(_ fd: Int32) {
        let copy = dup(fd)
        guard copy >= 0 else {
            fail("dup of the socket's descriptor failed: errno \(errno)")
            return
        }
        NIOPipeBootstrap(group: eventLoop)
            // One read per wake: the count read is written straight back, and read again it would
            // only be written back again until the drain consumes it.
            .channelOption(.maxMessagesPerRead, value: 1)
            .channelInitializer { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Readiness(fd: fd, lane: self))
                }
            }
            .takingOwnershipOfDescriptor(input: copy)
            .whenComplete { [self] result in
                switch result {
                case .success(let channel):
                    if isClosed { channel.close(promise: nil); return }
                    watchers.append(channel)
                    // A loop that shuts down closes its channels: the lane closes with them.
                    channel.closeFuture.whenComplete { [self] _ in close() }
                    scheduleDrain()  // what arrived before the watcher was in place
                case .failure(let error):
                    _ = Glibc.close(copy)  // still ours: NIO did not take it
                    fail("cannot watch the socket's descriptor: \(error)")
                }
            }
    }

    /// The lane cannot hear replies: the calls it sent fail as lost (a retry-safe one goes again,
    /// through the I/O thread), and it sends nothing more.
    private func fail(_ reason: String) {
        client.logger.error("an event loop's bus socket stopped; its calls use the I/O thread", metadata: [
            "endpoint": "\(client.configuration.endpoint)", "reason": "\(reason)",
        ])
        broken = true
        client.failSent(&timers)
    }

    /// Sends `item` from this loop; false when the I/O thread must take it instead (the lane is
    /// closed or broken, or no replica is connected yet). Called on `eventLoop`.
    func send(_ item: BusClient.Outgoing) -> Bool {
        guard !isClosed, !broken, client.sendRequest(item, on: socket, connected: lost.connected, timers: &timers) else { return false }
        armAlarm(for: item.deadline)
        // A send may have consumed libzmq's signal for replies already in: look once this turn.
        scheduleDrain()
        return true
    }

    /// Drains once the loop has handled this turn's I/O events. Not inline from a watcher: that
    /// would consume the other watcher's signal after epoll reported it and before NIO reads it.
    fileprivate func scheduleDrain() {
        guard !drainScheduled else { return }
        drainScheduled = true
        eventLoop.execute { [self] in
            drainScheduled = false
            drain()
        }
    }

    /// Reads every reply and connection event until libzmq has nothing more, which also consumes
    /// its signals (asking a socket's events processes its commands).
    private func drain() {
        guard !isClosed else { return }
        repeat {
            client.receiveReplies(on: socket)
            if let monitor, lost.confirmed(monitor: monitor, socket: socket) { client.failSent(&timers) }
        } while socket.isReadable || monitor?.isReadable == true
        if let check = lost.nextCheck { armAlarm(for: check) }
    }

    private func armAlarm(for deadline: ContinuousClock.Instant) {
        let at = deadline.advanced(by: Self.alarmSlack)
        if let current = alarmDeadline, current <= at { return }
        alarm?.cancel()
        alarmDeadline = at
        let delay = ContinuousClock.now.duration(to: at)
        alarm = eventLoop.scheduleTask(in: .nanoseconds(Int64(max(delay, .zero) / .nanoseconds(1)))) { [self] in ring() }
    }

    /// Fails the calls whose deadline passed, then sets the alarm for the next.
    private func ring() {
        alarm = nil
        alarmDeadline = nil
        guard !isClosed else { return }
        client.expire(&timers)
        if lost.nextCheck != nil, lost.confirmed(monitor: nil, socket: socket) { client.failSent(&timers) }
        if let next = [timers.min?.deadline, lost.nextCheck].compactMap({ $0 }).min() { armAlarm(for: next) }
    }

    /// Stops watching and closes the sockets; called on `eventLoop`. Calls still waiting are the
    /// client's to fail.
    func close() {
        guard !isClosed else { return }
        closedFlag.store(true, ordering: .releasing)
        alarm?.cancel()
        alarm = nil
        // Out of NIO's selector before libzmq closes what the descriptors point at.
        for watcher in watchers { watcher.close(promise: nil) }
        watchers.removeAll()
        BusClient.close(socket, monitor: monitor)
    }

    /// Whether `close()` has run; from any thread.
    var isClosed: Bool { closedFlag.load(ordering: .acquiring) }

    /// Waits at most `limit` for `close()` to have run (looking every 5 ms: this is shutdown);
    /// whether it has.
    func closed(within limit: Duration) async -> Bool {
        let deadline = ContinuousClock.now.advanced(by: limit)
        while !isClosed, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(5))
        }
        return isClosed
    }

    func logStuck() {
        client.logger.error("an event loop did not close its bus socket in time; it is left open", metadata: [
            "endpoint": "\(client.configuration.endpoint)",
        ])
    }

    /// Hands libzmq back the signal NIO read, then lets the lane read what it announced.
    private final class Readiness: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let fd: Int32
        let lane: EventLoopLane

        init(fd: Int32, lane: EventLoopLane) {
            self.fd = fd
            self.lane = lane
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = Self.unwrapInboundIn(data)
            var count: UInt64 = 0
            while let value = buffer.readInteger(endianness: .host, as: UInt64.self) { count &+= value }
            if count > 0 {
                _ = withUnsafeBytes(of: &count) { write(fd, $0.baseAddress, $0.count) }
            }
            lane.scheduleDrain()
        }
    }
}

/// A task executor whose jobs run on one NIO event loop. A task that prefers it
/// (`Task(executorPreference:)`, `withTaskExecutorPreference`) makes its bus calls through that
/// loop's socket (`EventLoopLane`) without the process handing Swift's pool to NIO, as the gateway
/// does with `GATEWAY_TASKS_ON_EVENT_LOOPS`. Such a task must not block.
public final class EventLoopTaskExecutor: TaskExecutor {
    public let loop: any EventLoop

    public init(_ loop: any EventLoop) { self.loop = loop }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
