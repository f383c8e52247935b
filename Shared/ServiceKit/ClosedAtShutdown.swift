import ServiceLifecycle

/// Closes what a service opened (its SQLite database: the group committer's or the ledger's
/// thread, the WAL checkpointer's) when its service group stops. Listed before the services that
/// use it, it is stopped after them: `close()` then answers every write still queued and
/// returns once the threads have ended.
public struct ClosedAtShutdown: Service {
    let close: @Sendable () async -> Void

    public init(_ close: @escaping @Sendable () async -> Void) { self.close = close }

    public func run() async throws {
        // Returns at graceful shutdown; throws if the group is cancelled instead: close either way.
        try? await gracefulShutdown()
        await close()
    }
}
