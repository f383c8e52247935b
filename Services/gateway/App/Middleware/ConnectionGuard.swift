import HTTPTypes
import Metrics
import NIOCore
import NIOHTTPTypes
import Synchronization

/// What a client may hold of the gateway: its connections, and how slowly it may send.
///
/// The head of each request, and the gap between two requests on a kept-alive connection, are
/// bounded by Hummingbird's own idle timeout (`HTTP_IDLE_TIMEOUT_S`: a connection that delivers no
/// part of a request for that long while no response is in progress is closed; a head sent a byte
/// at a time delivers no part until it is whole). What Hummingbird has no setting for is done by
/// `ConnectionGuard`, a channel handler on every connection:
/// - a request body must arrive at `minimumBodyRate` bytes a second on average once
///   `bodyGrace` has passed (nginx bounds the gap between two reads; a rate also stops a body
///   that sends a byte every few seconds);
/// - past `maxConnections` open at once, a new connection is closed at once, so the ones being
///   served keep their share instead of everyone starving.
/// Responses are not limited: an event stream may last its 15 minutes.
public struct ClientLimits: Sendable {
    public var idleTimeout: Duration
    public var minimumBodyRate: Int
    public var bodyGrace: Duration
    public var maxConnections: Int

    public init(idleTimeout: Duration = .seconds(60), minimumBodyRate: Int = 1024, bodyGrace: Duration = .seconds(10), maxConnections: Int = 10_000) {
        self.idleTimeout = idleTimeout
        self.minimumBodyRate = minimumBodyRate
        self.bodyGrace = bodyGrace
        self.maxConnections = maxConnections
    }
}

/// The gateway's open connections, counted across its event loops.
public final class ConnectionCount: Sendable {
    let open = Atomic<Int>(0)
    public init() {}
    public var current: Int { open.load(ordering: .relaxed) }
}

/// Enforces `ClientLimits` on one connection (see there).
final class ConnectionGuard: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    let limits: ClientLimits
    let count: ConnectionCount
    private var counted = false
    private var bodyStarted: NIODeadline?
    private var bodyBytes = 0
    private var check: Scheduled<Void>?

    static let refused = Counter(label: "gateway_connections_refused_total")
    static let slowBodies = Counter(label: "gateway_slow_bodies_closed_total")

    init(limits: ClientLimits, count: ConnectionCount) {
        self.limits = limits
        self.count = count
    }

    func handlerAdded(context: ChannelHandlerContext) {
        counted = true
        let open = count.open.wrappingAdd(1, ordering: .relaxed).newValue
        if open > limits.maxConnections {
            Self.refused.increment()
            context.close(promise: nil)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if counted { count.open.wrappingSubtract(1, ordering: .relaxed) }
        counted = false
        stopWatching()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            // Only a request that says it has a body is watched (a GET's end follows its head).
            if head.headerFields[.contentLength].map({ $0 != "0" }) ?? false || head.headerFields[.transferEncoding] != nil {
                startWatching(context)
            }
        case .body(let buffer):
            bodyBytes += buffer.readableBytes
        case .end:
            stopWatching()
        }
        context.fireChannelRead(data)
    }

    private func startWatching(_ context: ChannelHandlerContext) {
        stopWatching()
        bodyStarted = .now()
        bodyBytes = 0
        scheduleCheck(context, in: .nanoseconds(Int64(limits.bodyGrace / .nanoseconds(1))))
    }

    /// Checks the body's average rate after the grace, then every second until its end.
    private func scheduleCheck(_ context: ChannelHandlerContext, in delay: TimeAmount) {
        check = context.eventLoop.assumeIsolatedUnsafeUnchecked().scheduleTask(in: delay) { [self] in
            check = nil
            guard let started = bodyStarted else { return }
            let seconds = Double((NIODeadline.now() - started).nanoseconds) / 1e9
            if Double(bodyBytes) < Double(limits.minimumBodyRate) * seconds {
                Self.slowBodies.increment()
                stopWatching()
                context.close(promise: nil)
            } else {
                scheduleCheck(context, in: .seconds(1))
            }
        }
    }

    private func stopWatching() {
        check?.cancel()
        check = nil
        bodyStarted = nil
    }
}
