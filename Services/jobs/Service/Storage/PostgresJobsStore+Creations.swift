import Foundation
import JobsCore
import Logging
import Messages
import PostgresNIO
import Storage

/// Creations group-committed (`PostgresBatcher`): the creations that arrive while a batch is in
/// PostgreSQL make the next one, in one transaction of 4 statements whatever its size: BEGIN and
/// the statement timeout; one call of `jobs_create` (migration v13, planned once per connection
/// without sequential scans, as the dispatcher's functions are); COMMIT. The call takes the
/// advisory locks of the batch's job ids, in the order of their hash (a creation and an abandoning
/// lookup of one id stay serialised, and two replicas' batches never wait for each other in a
/// circle); then reads the rows of its ids already made and which of its ids were abandoned (a
/// statement of the function's own, after the locks: a statement's snapshot is taken when it
/// starts, and would miss what the lock's previous holder committed); then inserts the rows of the
/// ids that have neither (sent as one JSON array, so that absent values are NULL). Its creations
/// are decided in order: one id twice in a batch is created once, as its first creation says.
/// Those were three statements, each parsed and planned at every batch, and two round trips more.
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
        // Each id's row as its first creation in the batch would make it: the call inserts those
        // of ids that neither exist nor were abandoned, as the decisions below make them.
        var candidates: [String: JobRecord] = [:]
        for creation in batch where candidates[creation.request.jobId] == nil {
            let request = creation.request
            candidates[request.jobId] = JobRecord(
                id: request.jobId, userId: request.userId, isPro: request.isPro, imageKey: request.imageKey,
                effectId: creation.effectId, parameters: creation.parameters, prompt: request.prompt, status: .queued, progress: 0,
                attempts: 0, maxAttempts: retry.maxAttempts, lastError: nil, resultKey: nil, thumbnailKey: nil,
                createdAt: creation.now, updatedAt: creation.now, startedAt: nil, finishedAt: nil, version: 1, credits: request.credits,
                traceParent: request.traceParent, imageETag: request.imageETag
            )
        }
        let call = CreateJobs(ids: candidates.keys.sorted(), rows: try JobRowsJSON.new(candidates.values.sorted { $0.id < $1.id }))
        return try await database.transaction { [candidates] db in
            // The rows of its ids already made, and which of its ids were abandoned.
            var jobs: [String: JobRecord] = [:]
            var abandoned: Set<String> = []
            for try await (job, abandonedId) in try await db.execute(call, logger: logger) {
                if let abandonedId { abandoned.insert(abandonedId) }
                if let job { jobs[job.id] = job }
            }

            var results: [Result<Created, any Error>] = []
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
                // The call made it: the id's first creation in the batch.
                let job = candidates[request.jobId]!
                jobs[job.id] = job
                results.append(.success(Created(job: job, created: true)))
            }
            return results
        }
    }

    /// `create`'s statement: a call of `jobs_create` (migration v13), prepared once per
    /// connection. Its rows are each id's existing row (its columns null if none) beside the id
    /// if it was abandoned (null if not), for the ids that have either.
    struct CreateJobs: PostgresPreparedStatement {
        static let name = "jobs_create"
        static let sql = "SELECT " + PostgresJobsStore.columns.split(separator: ",").map { "(c.existing)." + $0.trimmingCharacters(in: .whitespacesAndNewlines) }
            .joined(separator: ", ") + ", c.abandoned FROM jobs_create($1::text[], $2::jsonb) AS c"
        var ids: [String]
        /// The rows to insert, as `JobRowsJSON.new` writes them.
        var rows: String

        func makeBindings() throws -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 2)
            bindings.append(ids)
            bindings.append(rows)
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> (JobRecord?, String?) {
            let cells = row.makeRandomAccess()
            let abandoned = try cells[JobRows.columnCount].decode(String?.self)
            return (cells[0].bytes != nil ? try PostgresJobsStore.job(row) : nil, abandoned)
        }
    }
}
