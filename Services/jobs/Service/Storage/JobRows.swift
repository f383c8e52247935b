import Foundation
import GRDB
import Messages
import Storage

/// The job and outbox rows that every state change reads and writes, through statements
/// prepared once per connection, with values bound and read by position. These are on the group
/// commit thread's path at every change of a job, and GRDB's `Codable` records cost most of that
/// thread's time there (per-call query building, the statement authorizer, `Codable` containers,
/// `DateFormatter`).
/// The text they write is the same as the records': dates as `StoredDate`, booleans as 0 and 1,
/// `parameters` as JSON. Rows written either way read back either way (tested).
public enum JobRows {
    static let columns = "id, userId, isPro, imageKey, effectId, parameters, prompt, status, progress, attempts, maxAttempts, lastError, resultKey, thumbnailKey, createdAt, updatedAt, startedAt, finishedAt, version, cancelRequested, credits, submission, traceParent, imageETag"
    /// How many `columns` there are: a query that selects more after them reads those from here.
    static let columnCount = 24

    /// The job of this id.
    static func job(_ db: Database, _ id: String) throws -> JobRecord? {
        let statement = try db.cachedStatement(sql: "SELECT \(columns) FROM job WHERE id = ?")
        guard let row = try Row.fetchOne(statement, arguments: [id]) else { return nil }
        return try job(row)
    }

    /// The jobs of these ids that exist, in one statement.
    static func jobs(_ db: Database, _ ids: [String]) throws -> [JobRecord] {
        var jobs: [JobRecord] = []
        jobs.reserveCapacity(ids.count)
        try forEachRow(db, ids) { jobs.append(try job($0)) }
        return jobs
    }

    /// Calls `body` with the row of each job of these ids that exists, read in one statement.
    static func forEachRow(_ db: Database, _ ids: [String], _ body: (Row) throws -> Void) throws {
        guard !ids.isEmpty else { return }
        let rows = try Row.fetchCursor(
            db.cachedStatement(sql: "SELECT \(columns) FROM job WHERE id IN (SELECT value FROM json_each(?))"),
            arguments: [jsonArray(ids)]
        )
        while let row = try rows.next() { try body(row) }
    }

    /// Ids as a JSON array, for `json_each` (written straight, without an encoder: every batch
    /// of the dispatcher's writes sends one).
    static func jsonArray(_ ids: [String]) -> String {
        var json = JSONBytes(capacity: 2 + ids.count * 40)
        json.raw("[")
        for (index, id) in ids.enumerated() {
            if index > 0 { json.raw(",") }
            json.string(id)
        }
        json.raw("]")
        return String(decoding: json.bytes, as: UTF8.self)
    }

    static func job(_ row: Row) throws -> JobRecord {
        let status: String = row[7]
        guard let state = JobStatus(rawValue: status) else {
            throw DatabaseError(resultCode: .SQLITE_CORRUPT, message: "job \(row[0] as String) has the unknown status \(status)")
        }
        return JobRecord(
            id: row[0], userId: row[1], isPro: row[2], imageKey: row[3], effectId: row[4],
            parameters: try parameters(row[5]), prompt: row[6], status: state, progress: row[8], attempts: row[9],
            maxAttempts: row[10], lastError: row[11], resultKey: row[12], thumbnailKey: row[13],
            createdAt: row[14], updatedAt: row[15], startedAt: row[16], finishedAt: row[17], version: row[18],
            cancelRequested: row[19], credits: row[20], submission: try submission(row[21]), traceParent: row[22], imageETag: row[23]
        )
    }

    /// Inserts a new job, due for history.
    static func insert(_ db: Database, _ job: JobRecord) throws {
        let statement = try db.cachedStatement(sql: "INSERT INTO job (\(columns), historyDueAt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        let updated = StoredDate.text(job.updatedAt)
        try statement.execute(arguments: [
            job.id, job.userId, job.isPro, job.imageKey, job.effectId, try text(job.parameters), job.prompt, job.status.rawValue,
            job.progress, job.attempts, job.maxAttempts, job.lastError, job.resultKey, job.thumbnailKey,
            StoredDate.text(job.createdAt), updated, job.startedAt.map(StoredDate.text),
            job.finishedAt.map(StoredDate.text), job.version, job.cancelRequested, job.credits, try text(job.submission), job.traceParent, job.imageETag, updated,
        ])
    }

    /// Writes what a change may change (everything but the request the job was made from). A
    /// state change (`announce`: its version was bumped) makes the row due for history at once,
    /// whatever was due before: history reads the job's current version from the row.
    static func update(_ db: Database, _ job: JobRecord, announce: Bool) throws {
        let set = "status = ?, progress = ?, attempts = ?, maxAttempts = ?, lastError = ?, resultKey = ?, thumbnailKey = ?, updatedAt = ?, startedAt = ?, finishedAt = ?, version = ?, cancelRequested = ?, submission = ?"
        let updated = StoredDate.text(job.updatedAt)
        var arguments: StatementArguments = [
            job.status.rawValue, job.progress, job.attempts, job.maxAttempts, job.lastError, job.resultKey, job.thumbnailKey,
            updated, job.startedAt.map(StoredDate.text), job.finishedAt.map(StoredDate.text),
            job.version, job.cancelRequested, try text(job.submission),
        ]
        if announce {
            arguments += [updated, job.id]
            try db.cachedStatement(sql: "UPDATE job SET \(set), historyDueAt = ?, historyAttempts = 0 WHERE id = ?").execute(arguments: arguments)
            try endAttempt(db, job)
        } else {
            arguments += [job.id]
            try db.cachedStatement(sql: "UPDATE job SET \(set) WHERE id = ?").execute(arguments: arguments)
        }
    }

    // MARK: Attempts

    /// Keeps the attempt a start began, with the worker it went to.
    static func startAttempt(_ db: Database, _ job: JobRecord, worker: String?) throws {
        try db.cachedStatement(sql: """
            INSERT INTO attempt (jobId, attempt, workerId, startedAt) VALUES (?, ?, ?, ?)
            ON CONFLICT (jobId, attempt) DO UPDATE SET workerId = excluded.workerId, startedAt = excluded.startedAt, endedAt = NULL, outcome = NULL, error = NULL
            """).execute(arguments: [job.id, job.attempts, worker, StoredDate.text(job.updatedAt)])
    }

    /// A state change that ends the job's current attempt (the job left `processing`) writes how
    /// it ended; an attempt ended already (a cancel of a queued job, an operator's retry) stays.
    static func endAttempt(_ db: Database, _ job: JobRecord) throws {
        guard job.attempts > 0, let outcome = AttemptRecord.outcome(of: job.status) else { return }
        try db.cachedStatement(sql: "UPDATE attempt SET endedAt = ?, outcome = ?, error = ? WHERE jobId = ? AND attempt = ? AND endedAt IS NULL")
            .execute(arguments: [StoredDate.text(job.updatedAt), outcome, job.status == .completed ? nil : job.lastError, job.id, job.attempts])
    }

    // MARK: Provider requests

    static func text(_ submission: ProviderRequest?) throws -> String? {
        guard let submission else { return nil }
        return String(decoding: try JSONEncoder().encode(submission), as: UTF8.self)
    }

    static func submission(_ text: String?) throws -> ProviderRequest? {
        guard let text else { return nil }
        return try JSONDecoder().decode(ProviderRequest.self, from: Data(text.utf8))
    }

    static func insertOutbox(_ db: Database, topic: String, kind: String, jobId: String, version: Int, payload: Data?, now: Date) throws {
        let statement = try db.cachedStatement(sql: """
            INSERT INTO outbox (topic, kind, jobId, version, payload, createdAt, attempts, nextAttemptAt) VALUES (?, ?, ?, ?, ?, ?, 0, ?)
            """)
        let stamp = StoredDate.text(now)
        try statement.execute(arguments: [topic, kind, jobId, version, payload, stamp, stamp])
    }

    // MARK: Parameters

    static func text(_ parameters: [String: Double]) throws -> String {
        if parameters.isEmpty { return "{}" }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return String(decoding: try encoder.encode(parameters), as: UTF8.self)
    }

    static func parameters(_ text: String) throws -> [String: Double] {
        if text == "{}" { return [:] }
        return try JSONDecoder().decode([String: Double].self, from: Data(text.utf8))
    }
}
