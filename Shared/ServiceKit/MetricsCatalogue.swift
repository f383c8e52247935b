/// The HELP text of every metric family the system exposes, by name: the gateway's `/metrics`
/// writes it for each family (swift-metrics, which the processes record with, carries none).
/// A family missing here has no HELP line, and `promtool check metrics` (run on a live scrape
/// by `scripts/prometheus-check.sh`) says so.
public enum MetricsCatalogue {
    public static let help: [String: String] = [
        // The gateway's HTTP server.
        "http_server_requests_total": "HTTP requests answered, by route template, method and status code.",
        "http_server_request_duration_seconds": "Time from a request's arrival to its response's head (a streamed body counts until it starts), by route template and method.",
        "http_server_request_errors_total": "HTTP requests answered with a 5xx status, by route template and method.",
        "http_server_active_requests": "HTTP requests in progress.",
        "gateway_connections_refused_total": "Connections closed at once because the gateway had HTTP_MAX_CONNECTIONS open.",
        "gateway_slow_bodies_closed_total": "Connections closed because a request body arrived slower than HTTP_BODY_MIN_BYTES_PER_S.",
        "gateway_uploads_aborted_total": "Uploads the client stopped before the body ended.",
        "gateway_provider_webhooks_total": "Provider webhooks by outcome (accepted, replayed, refused, unverifiable).",
        "gateway_uploads_refused_total": "Uploads or job inputs refused, by reason (too large, not an image, too many pixels).",
        "photoedit_scrape_up": "Whether the service answered the gateway's metrics scrape (1) or not (0).",
        "photoedit_disk_free_bytes": "Bytes free to the process on the file system of its data folder.",
        "photoedit_disk_size_bytes": "Size in bytes of the file system of the process's data folder.",
        // Every bus service.
        "bus_requests_total": "Bus requests handled, by method and answer (ok or the error code).",
        "bus_handler_duration_seconds": "Time a bus handler took, by method.",
        "bus_requests_in_progress": "Bus requests being handled now.",
        "bus_overloaded_total": "Bus requests answered overloaded because the service had its most in flight, by method.",
        "bus_callers_refused_total": "Bus connections refused for an unknown CURVE key, by ZAP domain.",
        // Quota.
        "quota_decisions_total": "Quota admissions and denials, by decision and by the window that admitted or refused.",
        "quota_guests_refused_total": "Guest devices refused by the per-network guest limits.",
        "quota_ledger_backlog": "Quota decisions durable in the ledger's log but not yet written into its tables (checkpoints every 100 ms).",
        // History.
        "history_events_received_total": "Job events history received from jobs.",
        "history_events_applied_total": "Job events that changed a history item (the rest were repeats or older).",
        "history_event_lag_seconds": "Age of a job event when history received it: from the job's change to now.",
        // Jobs.
        "jobs_by_state": "Jobs in each state, read at the scrape.",
        "jobs_queue_length": "Jobs waiting for a worker (backoffs included).",
        "jobs_oldest_queued_age_seconds": "Age of the oldest queued job (0 with none queued).",
        "jobs_outbox_backlog": "Outbox entries waiting to be delivered, by topic (quota, history, blobs, push).",
        "jobs_push_total": "Push notifications of ended jobs, by platform and outcome (delivered, retried, unregistered, rejected, expired).",
        "jobs_workers_connected": "Workers connected to the jobs service now.",
        "jobs_worker_slots_held": "Worker slots taken by jobs now.",
        "jobs_generations_awaiting": "Generations waiting in a provider's queue, held by no worker slot.",
        "jobs_wait_before_assignment_seconds": "Time from a job's creation to its first assignment to a worker.",
        "jobs_run_duration_seconds": "Time from a job's assignment to its recorded result, by effect (completed jobs).",
        "jobs_results_total": "Jobs ended, by effect and final state.",
        "jobs_credits_charged_total": "Credits of completed jobs committed to quota, by effect and provider.",
        "jobs_requeued_total": "Jobs queued again, by cause (worker_lost, assignment_lost, unheld).",
        "jobs_unused_uploads_deleted_total": "Uploads deleted because no job used them in time.",
        // Workers (sent to jobs, shown with service="worker" and the worker's id).
        "worker_jobs_total": "Jobs a worker ran, by effect and outcome.",
        "worker_job_duration_seconds": "Time a worker took to run a job, by effect (completed jobs).",
        "worker_jobs_in_progress": "Jobs holding one of the worker's places now.",
        "worker_generations_waiting": "Generations waiting at a provider's queue without a worker place.",
        "worker_provider_abandoned_total": "Generations given up at their timeout, by provider and outcome (let_go, finished, unconfirmed).",
        "worker_provider_requests_total": "HTTP requests to a model provider, by provider, model and answer status.",
        "worker_provider_request_seconds": "Latency of HTTP requests to a model provider, by provider and model.",
        "worker_provider_refusals_total": "Edits a model provider refused for safety, by provider and model.",
        "worker_provider_rate_limit_waits_total": "Waits a provider's 429 or Retry-After asked for, by provider and model.",
        "worker_provider_errors_total": "Provider failures by provider and kind (key, billing, rate_limit, server, unreachable, timeout, refused).",
    ]
}
