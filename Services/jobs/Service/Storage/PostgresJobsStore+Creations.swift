import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import Storage

/// Creations group-committed (`PostgresBatcher`): the creations that arrive while a batch is in
/// PostgreSQL make the next one, in one transaction of at most 6 statements whatever its size:
/// BEGIN and the statement timeout; the advisory locks of its job ids, in the order of their hash
/// (a creation and an abandoning lookup of one id stay serialised, and two replicas' batches never
/// wait for each other in a circle); the rows of its ids already made and which of its ids were
/// abandoned, in one read (after the locks, in a statement of its own: a statement's snapshot is
/// taken when it starts, and would miss what the lock's previous holder committed); every new
/// row in one insert (its rows as one JSON array, so that absent values are NULL); COMMIT. Its
/// creations are decided in order: one id twice in a batch is created once.
extension PostgresJobsStore {
    /// One creation of a batch.
    struct Creation: Sendable {
        var request: CreateJob
        var effectId: String
        var parameters: [String: Double]
        var now: Date
    }

    struct Created: Sendable {
        var job: JobRecord
        var created: Bool
    }

    /// Creates `batch` in one transaction (see the extension's notes).
    static func create(_ batch: [Creation], database: PostgresPool, retry: RetryPolicy, logger: Logger) async throws -> [Result<Created, any Error>] {
        try await database.transaction { db in
            let ids = Array(Set(batch.map(\.request.jobId)))
            try await db.lockInHashOrder(ids.map { "jobs:job:" + $0 }, logger: logger)
            // The rows of its ids already made, and which of its ids were abandoned, in one read:
            // each id's row (its columns null if none), then its abandoned mark (null if none).
            var jobs: [String: JobRecord] = [:]
            var abandoned: Set<String> = []
            for try await row in try await db.query("""
                SELECT \(unescaped: columns), a.job_id FROM unnest(\(ids)::text[]) AS k(wanted)
                LEFT JOIN jobs_job ON jobs_job.id = k.wanted LEFT JOIN jobs_abandoned AS a ON a.job_id = k.wanted
                WHERE jobs_job.id IS NOT NULL OR a.job_id IS NOT NULL
                """, logger: logger) {
                let cells = row.makeRandomAccess()
                if let id = try cells[JobRows.columnCount].decode(String?.self) { abandoned.insert(id) }
                if cells[0].bytes != nil {
                    let job = try job(row)
                    jobs[job.id] = job
                }
            }

            var results: [Result<Created, any Error>] = []
            var made: [JobRecord] = []
            for creation in batch {
                let request = creation.request
                if let existing = jobs[request.jobId] {
                    guard existing.userId == request.userId else {
                        results.append(.failure(BusError(.conflict, "job id \(request.jobId) belongs to another user")))
                        continue
                    }
                    results.append(.success(Created(job: existing, created: false)))
                    continue
                }
                guard !abandoned.contains(request.jobId) else {
                    results.append(.failure(BusError(
                        Jobs.ErrorCode.abandoned,
                        "job \(request.jobId) was abandoned: its reservation was given back before it was created; send a new request", retryable: false
                    )))
                    continue
                }
                let job = JobRecord(
                    id: request.jobId, userId: request.userId, isPro: request.isPro, imageKey: request.imageKey,
                    effectId: creation.effectId, parameters: creation.parameters, prompt: request.prompt, status: .queued, progress: 0,
                    attempts: 0, maxAttempts: retry.maxAttempts, lastError: nil, resultKey: nil, thumbnailKey: nil,
                    createdAt: creation.now, updatedAt: creation.now, startedAt: nil, finishedAt: nil, version: 1, credits: request.credits,
                    traceParent: request.traceParent, imageETag: request.imageETag
                )
                jobs[job.id] = job
                made.append(job)
                results.append(.success(Created(job: job, created: true)))
            }
            if !made.isEmpty {
                let rows = try JobRowsJSON.new(made.sorted { $0.id < $1.id })
                try await db.query("""
                    INSERT INTO jobs_job (\(unescaped: columns), history_due_at)
                    SELECT \(unescaped: columns), history_due_at FROM jsonb_populate_recordset(NULL::jobs_job, \(rows)::jsonb)
                    """, logger: logger)
            }
            return results
        }
    }
}
