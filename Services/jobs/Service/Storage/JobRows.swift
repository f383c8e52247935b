import Bus
import Foundation
import GRDB
import Messages
import Storage

/// The job and outbox rows that every state change reads and writes, through statements
/// prepared once per connection, with values bound and read by position. These are on the group
/// commit thread's path 3 times a job, and GRDB's `Codable` records cost most of that thread's time
/// there (per-call query building, the statement authorizer, `Codable` containers, `DateFormatter`).
/// The text they write is the same as the records': dates as `StoredDate`, booleans as 0 and 1,
/// `parameters` as JSON. Rows written either way read back either way (tested).
public enum JobRows {
    static let columns = "id, userId, isPro, imageKey, effectId, parameters, prompt, status, progress, attempts, maxAttempts, lastError, resultKey, thumbnailKey, createdAt, updatedAt, startedAt, finishedAt, version, cancelRequested, credits, submission, traceParent"

    /// The job of this id.
    static func job(_ db: Database, _ id: String) throws -> JobRecord? {
        let statement = try db.cachedStatement(sql: "SELECT \(columns) FROM job WHERE id = ?")
        guard let row = try Row.fetchOne(statement, arguments: [id]) else { return nil }
        return try job(row)
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
            cancelRequested: row[19], credits: row[20], submission: try submission(row[21]), traceParent: row[22]
        )
    }

    static func insert(_ db: Database, _ job: JobRecord) throws {
        let statement = try db.cachedStatement(sql: "INSERT INTO job (\(columns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        try statement.execute(arguments: [
            job.id, job.userId, job.isPro, job.imageKey, job.effectId, try text(job.parameters), job.prompt, job.status.rawValue,
            job.progress, job.attempts, job.maxAttempts, job.lastError, job.resultKey, job.thumbnailKey,
            StoredDate.text(job.createdAt), StoredDate.text(job.updatedAt), job.startedAt.map(StoredDate.text),
            job.finishedAt.map(StoredDate.text), job.version, job.cancelRequested, job.credits, try text(job.submission), job.traceParent,
        ])
    }

    /// Writes what a state change may change (everything but the request the job was made from).
    static func update(_ db: Database, _ job: JobRecord) throws {
        let statement = try db.cachedStatement(sql: """
            UPDATE job SET status = ?, progress = ?, attempts = ?, lastError = ?, resultKey = ?, thumbnailKey = ?,
              updatedAt = ?, startedAt = ?, finishedAt = ?, version = ?, cancelRequested = ?, submission = ? WHERE id = ?
            """)
        try statement.execute(arguments: [
            job.status.rawValue, job.progress, job.attempts, job.lastError, job.resultKey, job.thumbnailKey,
            StoredDate.text(job.updatedAt), job.startedAt.map(StoredDate.text), job.finishedAt.map(StoredDate.text),
            job.version, job.cancelRequested, try text(job.submission), job.id,
        ])
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

    // MARK: History event payloads

    /// The first byte of a payload in the bus's binary coding; JSON (as older rows hold) never
    /// starts with it.
    static let binaryMarker: UInt8 = 0

    /// A history event as stored in the outbox: the binary coding, marked.
    static func payload(_ event: JobEvent) throws -> Data {
        var bytes = [binaryMarker]
        bytes += try BinaryCoding.encode(event)
        return Data(bytes)
    }

    /// A stored history event, binary or (from before) JSON.
    public static func event(_ payload: Data) throws -> JobEvent {
        if payload.first == binaryMarker { return try BinaryCoding.decode(JobEvent.self, from: Array(payload.dropFirst())) }
        return try JSONDecoder().decode(JobEvent.self, from: payload)
    }
}
