import Foundation
import Messages

/// Job rows as one JSON array, the way `jsonb_populate_recordset(NULL::jobs_job, ...)` reads
/// them: keys named as the columns, an absent key NULL. Written straight into bytes, without
/// `JSONEncoder`: each batch of the PostgreSQL dispatcher's writes and of its creations sends one,
/// and the encoder's containers were about 2% of the machine in `make bench-jobs STORE=postgres`
/// (perf), on the event loop that runs the batches.
struct JobRowsJSON {
    private var out: JSONBytes
    private var rows = 0
    private var fields = 0

    init(capacity rows: Int) {
        out = JSONBytes(capacity: 2 + rows * 400)
        out.raw("[")
    }

    /// The array's text.
    var text: String {
        var out = out
        out.raw("]")
        return String(decoding: out.bytes, as: UTF8.self)
    }

    /// A row whose fields `body` writes.
    mutating func row(_ body: (inout JobRowsJSON) throws -> Void) rethrows {
        if rows > 0 { out.raw(",") }
        rows += 1
        fields = 0
        out.raw("{")
        try body(&self)
        out.raw("}")
    }

    private mutating func key(_ name: StaticString) {
        if fields > 0 { out.raw(",") }
        fields += 1
        out.raw("\"")
        out.raw(name)
        out.raw("\":")
    }

    /// A text column; nil leaves it out (NULL).
    mutating func field(_ name: StaticString, _ value: String?) {
        guard let value else { return }
        key(name)
        out.string(value)
    }

    /// A number column (a date as seconds since 1970); nil leaves it out (NULL).
    mutating func field(_ name: StaticString, _ value: Double?) {
        guard let value else { return }
        key(name)
        out.number(value)
    }

    mutating func field(_ name: StaticString, _ value: Int) {
        key(name)
        out.integer(value)
    }

    mutating func field(_ name: StaticString, _ value: Bool) {
        key(name)
        out.bool(value)
    }

    /// New jobs' rows, as a creation inserts them: no error, result, start, end or submission
    /// yet, and due for history at once.
    static func new(_ jobs: [JobRecord]) throws -> String {
        var rows = JobRowsJSON(capacity: jobs.count)
        for job in jobs {
            let parameters = try JobRows.text(job.parameters)
            rows.row { row in
                row.field("id", job.id)
                row.field("user_id", job.userId)
                row.field("is_pro", job.isPro)
                row.field("image_key", job.imageKey)
                row.field("effect_id", job.effectId)
                row.field("parameters", parameters)
                row.field("prompt", job.prompt)
                row.field("status", job.status.rawValue)
                row.field("progress", job.progress)
                row.field("attempts", job.attempts)
                row.field("max_attempts", job.maxAttempts)
                row.field("created_at", job.createdAt.timeIntervalSince1970)
                row.field("updated_at", job.updatedAt.timeIntervalSince1970)
                row.field("version", job.version)
                row.field("cancel_requested", job.cancelRequested)
                row.field("credits", job.credits)
                row.field("trace_parent", job.traceParent)
                row.field("image_etag", job.imageETag)
                row.field("history_due_at", job.updatedAt.timeIntervalSince1970)
            }
        }
        return rows.text
    }

    /// What transitions change in jobs' rows (what `update` writes).
    static func changed(_ jobs: [JobRecord]) throws -> String {
        var rows = JobRowsJSON(capacity: jobs.count)
        for job in jobs {
            let submission = try JobRows.text(job.submission)
            rows.row { row in
                row.field("id", job.id)
                row.field("status", job.status.rawValue)
                row.field("progress", job.progress)
                row.field("attempts", job.attempts)
                row.field("last_error", job.lastError)
                row.field("result_key", job.resultKey)
                row.field("thumbnail_key", job.thumbnailKey)
                row.field("updated_at", job.updatedAt.timeIntervalSince1970)
                row.field("started_at", job.startedAt?.timeIntervalSince1970)
                row.field("finished_at", job.finishedAt?.timeIntervalSince1970)
                row.field("version", job.version)
                row.field("cancel_requested", job.cancelRequested)
                row.field("submission", submission)
            }
        }
        return rows.text
    }
}
