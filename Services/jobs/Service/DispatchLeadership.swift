import Bus
import Foundation
import JobsCore
import Logging
import PostgresNIO
import ServiceLifecycle
import Storage

/// The dispatcher's lease in `jobs_leader`, as River and Oban elect their leader: one row, taken
/// by whoever finds it expired and kept by renewing it before it expires. Times are the
/// database's (`now()`), so replicas' clocks do not matter. Each takeover raises the lease's
/// term, which fences the deposed holder's writes (`PostgresJobsStore.fenced`).
public struct DispatchElection: Sendable {
    let database: PostgresPool
    /// This replica, as the lease names it (unique per process start).
    public let holder: String
    /// How long a lease lasts unless renewed.
    public let ttl: Duration
    let logger: Logger

    public init(database: PostgresPool, holder: String = UUID().uuidString, ttl: Duration = .seconds(1), logger: Logger) {
        self.database = database
        self.holder = holder
        self.ttl = ttl
        self.logger = logger
    }

    /// Takes the lease if it is free or expired, or renews it if this replica holds it; the term
    /// held, or nil when another replica holds it.
    public func claim() async throws -> Int64? {
        let (holder, milliseconds, logger) = (holder, Int(ttl.components.seconds * 1000 + ttl.components.attoseconds / 1_000_000_000_000_000), logger)
        return try await database.connection { db in
            try await db.first(
                """
                INSERT INTO jobs_leader (name, holder, term, expires_at)
                VALUES ('dispatcher', \(holder), 1, now() + \(milliseconds) * interval '1 millisecond')
                ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
                    term = CASE WHEN jobs_leader.holder = excluded.holder THEN jobs_leader.term ELSE jobs_leader.term + 1 END
                WHERE jobs_leader.holder = excluded.holder OR jobs_leader.expires_at < now()
                RETURNING term
                """,
                as: Int64.self, logger: logger
            )
        }
    }

    /// Gives the lease up at once (a graceful stop): another replica takes it at its next try
    /// instead of after the lease would have run out.
    public func resign() async {
        let (holder, logger) = (holder, logger)
        _ = try? await database.connection { db in
            _ = try await db.query(
                "UPDATE jobs_leader SET expires_at = now() - interval '1 second' WHERE name = 'dispatcher' AND holder = \(holder)", logger: logger
            )
        }
    }
}

/// Runs the dispatcher on whichever jobs replica holds the lease. Every replica tries to take it
/// every `ttl / 4`; the one that holds it binds the worker endpoint, loads the queue
/// (`recover`), and dispatches until it loses the lease (another took it after this one failed
/// to renew in time, or it cannot renew for a whole `ttl`): then it stops its dispatcher and
/// unbinds, and its late writes are refused by the fence. Workers list every replica's worker
/// endpoint and talk to the one that is bound. While it leads it also hears the other
/// replicas' creations and cancels (`LISTEN jobs_dispatch`), catches up with the table every
/// `catchUp`, and stores its workers' progress every `progressEvery`. On a graceful shutdown it
/// resigns, so another replica takes over at once.
public struct DispatchLeadership: Service {
    let election: DispatchElection
    let store: PostgresJobsStore
    let link: ReplicatedDispatch
    /// Makes the dispatcher (on its channel) for a term's fenced store.
    let makeDispatcher: @Sendable (PostgresJobsStore) -> (Dispatcher, BusChannel)
    let catchUp: Duration
    let progressEvery: Duration
    let logger: Logger

    public init(
        election: DispatchElection, store: PostgresJobsStore, link: ReplicatedDispatch, catchUp: Duration = .seconds(5),
        progressEvery: Duration = .milliseconds(500), logger: Logger, makeDispatcher: @escaping @Sendable (PostgresJobsStore) -> (Dispatcher, BusChannel)
    ) {
        self.election = election
        self.store = store
        self.link = link
        self.makeDispatcher = makeDispatcher
        self.catchUp = catchUp
        self.progressEvery = progressEvery
        self.logger = logger
    }

    var tryEvery: Duration { election.ttl / 4 }

    public func run() async throws {
        await withGracefulShutdownHandler {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                if let term = try? await election.claim() {
                    await lead(term: term)
                }
                try? await Task.sleep(for: tryEvery)
            }
        } onGracefulShutdown: {}
        await election.resign()
    }

    /// Dispatches for the term until the lease is lost or the service stops.
    func lead(term: Int64) async {
        let fenced = store.fenced(.init(holder: election.holder, term: term))
        let (dispatcher, channel) = makeDispatcher(fenced)
        logger.info("leading dispatch", metadata: ["term": "\(term)", "holder": "\(election.holder)"])
        await withTaskGroup(of: Void.self) { group in
            // Renews the lease; returning ends the term here.
            group.addTask { await keep(term: term) }
            group.addTask {
                do {
                    // Listening before loading the queue: a job created after the load is heard of.
                    try await listen(for: dispatcher) {
                        await dispatcher.apply(try await fenced.dispatchControls())
                        await dispatcher.load(try await fenced.recover(now: Date()))
                        link.lead(dispatcher)
                    }
                } catch {
                    logger.warning("dispatch stopped: cannot hear the other replicas", metadata: ["error": "\(error)"])
                }
            }
            group.addTask {
                do {
                    try await DispatcherService(dispatcher: dispatcher, channel: channel).run()
                } catch {
                    logger.error("dispatch stopped: the worker endpoint cannot be bound", metadata: ["error": "\(error)"])
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: catchUp)
                    if let queued = try? await fenced.queued() { await dispatcher.enqueueUnknown(queued) }
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: progressEvery)
                    try? await fenced.saveProgress(await dispatcher.runningProgress)
                }
            }
            await group.next()
            group.cancelAll()
        }
        link.lead(nil)
        logger.info("dispatch handed over", metadata: ["term": "\(term)"])
    }

    /// Renews the lease every `tryEvery`; returns once another replica holds it, once it could
    /// not be renewed for a whole `ttl` (this replica may be cut off: another takes over after
    /// the lease runs out), or on shutdown.
    func keep(term: Int64) async {
        var renewed = ContinuousClock.now
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            try? await Task.sleep(for: tryEvery)
            do {
                guard try await election.claim() == term else { return }
                renewed = .now
            } catch {
                if ContinuousClock.now - renewed >= election.ttl { return }
            }
        }
    }

    /// Listens to the other replicas' creations, cancels and webhooks; `ready` runs once the
    /// listening has started.
    func listen(for dispatcher: Dispatcher, ready: @escaping @Sendable () async throws -> Void) async throws {
        try await store.database.session { db in
            try await db.listen(on: ReplicatedDispatch.channel) { notifications in
                try await ready()
                for try await notification in notifications {
                    guard let note = try? JSONDecoder().decode(DispatchNote.self, from: Data(notification.payload.utf8)) else { continue }
                    switch note.kind {
                    case .enqueue:
                        if let jobs = try? await store.jobs([note.jobId]) { await dispatcher.enqueueUnknown(jobs) }
                    case .cancel:
                        await dispatcher.cancel(jobId: note.jobId, userId: note.userId)
                    case .poke:
                        await dispatcher.poke(jobId: note.jobId)
                    case .controls:
                        if let controls = try? await store.dispatchControls() { await dispatcher.apply(controls) }
                    }
                }
            }
        }
    }
}

/// What a replica tells the leading one (`NOTIFY jobs_dispatch`, JSON).
struct DispatchNote: Codable, Sendable {
    enum Kind: String, Codable, Sendable { case enqueue, cancel, poke, controls }
    var kind: Kind
    var jobId: String
    var userId: String
}
