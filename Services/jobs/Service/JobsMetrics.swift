import Bus
import Foundation
import Messages
import JobsCore
import Metrics

/// The jobs service's metrics (swift-metrics; the process exposes them through `metrics.scrape`).
/// Gauges read from the database (`jobs_by_state`, `jobs_outbox_backlog`) and the dispatcher
/// (`jobs_queue_length`) are set just before each scrape.
public enum JobsMetrics {
    /// Workers connected now.
    static let workersConnected = Gauge(label: "jobs_workers_connected")
    /// From a job's creation to its first assignment to a worker.
    static let waitBeforeAssignment = Metrics.Timer(label: "jobs_wait_before_assignment_seconds")

    /// Makes every series whose labels are known at the start, at zero: results by effect of the
    /// catalogue and final state, credits and run time by effect, requeues by cause, the gauges.
    /// A scrape right after the start has them, so `rate()` is 0 and an absence alert is quiet.
    public static func prepare(catalog: EffectCatalog) {
        workersConnected.record(0)
        _ = waitBeforeAssignment
        for effect in catalog.effects.keys {
            for state in [JobStatus.completed, .failed, .cancelled] {
                _ = Counter(label: "jobs_results_total", dimensions: [("effect", effect), ("state", state.rawValue)])
            }
            _ = Counter(label: "jobs_credits_charged_total", dimensions: [("effect", effect), ("provider", catalog.provider(of: effect) ?? "none")])
            _ = Metrics.Timer(label: "jobs_run_duration_seconds", dimensions: [("effect", effect)])
        }
        for cause in [Dispatcher.Machine.RequeueCause.workerLost, .assignmentLost, .unheld] {
            _ = Counter(label: "jobs_requeued_total", dimensions: [("cause", cause.rawValue)])
        }
        _ = Counter(label: "jobs_unused_uploads_deleted_total")
        refresh(states: [:], outbox: [:], queued: 0)
    }

    /// Counts a recorded result by effect and final state; a completed job's run time (from its
    /// assignment to the recorded result) goes to `jobs_run_duration_seconds` by effect.
    /// A completed job's credits (committed to quota) go to `jobs_credits_charged_total` by
    /// effect and provider (`none` for the built-in effects).
    static func finished(_ job: JobRecord, runningSince: ContinuousClock.Instant?, provider: String?) {
        Counter(label: "jobs_results_total", dimensions: [("effect", job.effectId), ("state", job.status.rawValue)]).increment()
        if job.status == .completed {
            Counter(label: "jobs_credits_charged_total", dimensions: [("effect", job.effectId), ("provider", provider ?? "none")]).increment(by: job.credits)
        }
        if job.status == .completed, let runningSince {
            Metrics.Timer(label: "jobs_run_duration_seconds", dimensions: [("effect", job.effectId)]).record(runningSince.duration(to: .now))
        }
    }

    /// Sets the gauges read at scrape time.
    /// `oldestQueuedAge`: seconds since the oldest queued job was created (0 with none queued),
    /// `jobs_oldest_queued_age_seconds`.
    public static func refresh(states: [JobStatus: Int], outbox: [String: Int], queued: Int, awaiting: Int = 0, slotsHeld: Int = 0, oldestQueuedAge: Double = 0) {
        Gauge(label: "jobs_oldest_queued_age_seconds").record(oldestQueuedAge)
        // Generations waiting in providers' queues, held by workers without a slot, and the
        // worker slots taken now.
        Gauge(label: "jobs_generations_awaiting").record(awaiting)
        Gauge(label: "jobs_worker_slots_held").record(slotsHeld)
        for status in JobStatus.allCases {
            Gauge(label: "jobs_by_state", dimensions: [("state", status.rawValue)]).record(states[status] ?? 0)
        }
        for topic in ["quota", "history", "blobs", "push"] {
            Gauge(label: "jobs_outbox_backlog", dimensions: [("topic", topic)]).record(outbox[topic] ?? 0)
        }
        Gauge(label: "jobs_queue_length").record(queued)
    }
}
