import Foundation
import HistoryService
import JWTKit
import Logging
import Messages
import PostgresNIO
import Storage

// History benchmark helper.
//   history-bench fill PATH USERS ITEMS BIG_ITEMS
//     fills a history database with ITEMS completed items of USERS users, BIG_ITEMS of them for
//     `user-big`, the rest spread over `user-00000`...; prompts from a small vocabulary, one item a
//     minute back from now. Writes go through HistoryDatabase's own method for job events.
//   history-bench fill-postgres URL USERS ITEMS BIG_ITEMS
//     the same history (same users, prompts from the same vocabulary, same times) in PostgreSQL,
//     migrated as the history service migrates it; written by set-based SQL (a million items
//     through the store's per-event method would take most of an hour), counts and change
//     numbers included, as the store keeps them.
//   history-bench events PATH JOBS
//     applies the events of JOBS jobs' whole lives (queued, processing, two progress steps,
//     completed: one insert and four updates each) through HistoryDatabase's method for job
//     events, in deliveries of 200 events from jobs running side by side, as jobs' outbox
//     delivers them; prints the events applied per second, inserts and updates apart.
//   history-bench token SECRET SUB
//     prints an HS256 token for SUB, valid one hour.

let words = ["sunset", "ocean", "portrait", "city", "forest", "neon", "mountain", "vintage", "dramatic", "soft",
             "golden", "misty", "winter", "summer", "night", "studio", "river", "desert", "garden", "storm"]
let effects = [("blur", "Soft Focus"), ("grayscale", "Black & White"), ("sharpen", "Sharpen"), ("auto-enhance", "Auto Enhance")]

func event(index: Int, user: String, createdAt: Date, random: inout SystemRandomNumberGenerator) -> JobEvent {
    let prompt = (0..<3).map { _ in words.randomElement(using: &random)! }.joined(separator: " ") + " #\(index)"
    let effect = effects[index % effects.count]
    let id = String(format: "job-%08d", index)
    return JobEvent(
        job: JobRecord(
            id: id, userId: user, isPro: false, imageKey: "uploads/bench/\(id).jpg", effectId: effect.0, parameters: [:], prompt: prompt,
            status: .completed, progress: 1, attempts: 1, maxAttempts: 3, lastError: nil, resultKey: "results/\(id)/1.jpg",
            thumbnailKey: "thumbnails/\(id)/1.jpg", createdAt: createdAt, updatedAt: createdAt, startedAt: createdAt, finishedAt: createdAt, version: 4
        ),
        effectTitle: effect.1
    )
}

func fill(path: String, users: Int, items: Int, bigItems: Int) async throws {
    let database = try HistoryDatabase.open(path: path)
    var random = SystemRandomNumberGenerator()
    let now = Date()
    let started = ContinuousClock.now
    var batch: [JobEvent] = []
    batch.reserveCapacity(5000)
    for index in 0..<items {
        let user = index < bigItems ? "user-big" : String(format: "user-%05d", index % max(1, users - 1))
        batch.append(event(index: index, user: user, createdAt: now.addingTimeInterval(-Double(items - index) * 2), random: &random))
        if batch.count == 5000 {
            _ = try await database.applyJobEvents(batch)
            batch.removeAll(keepingCapacity: true)
            if index % 100_000 == 99_999 { print("filled \(index + 1) items in \(started.duration(to: .now))") }
        }
    }
    if !batch.isEmpty { _ = try await database.applyJobEvents(batch) }
    print("filled \(items) items for \(users) users in \(started.duration(to: .now))")
}

func fillPostgres(url: String, users: Int, items: Int, bigItems: Int) async throws {
    let logger = { var logger = Logger(label: "history-bench"); logger.logLevel = .warning; return logger }()
    let location = try PostgresLocation(variable: "URL", url: url)
    let started = ContinuousClock.now
    _ = try await PostgresPool.migrate(location, service: "history", PostgresHistoryStore.migrations, logger: logger) { [logger] db in
        try await PostgresHistoryStore.tokenKey(db, logger: logger)
    }
    let now = Date().timeIntervalSince1970
    let vocabulary = words
    let titles = effects.map(\.1), ids = effects.map(\.0)
    try await PostgresPool(location: location, maximumConnections: 1, logger: logger).running { pool in
        try await pool.session { db in
            try await db.query(
                """
                INSERT INTO history_item (job_id, user_id, effect_id, effect_title, prompt, status, progress, created_at, updated_at,
                    finished_at, result_key, thumbnail_key, image_key, parameters, cost, last_error, version, change_sequence)
                SELECT 'job-' || lpad(i::text, 8, '0'),
                    CASE WHEN i < \(bigItems) THEN 'user-big' ELSE 'user-' || lpad((i % \(max(1, users - 1)))::text, 5, '0') END,
                    (\(ids)::text[])[1 + i % 4], (\(titles)::text[])[1 + i % 4],
                    (\(vocabulary)::text[])[1 + floor(random() * 20)::int] || ' ' || (\(vocabulary)::text[])[1 + floor(random() * 20)::int] || ' '
                        || (\(vocabulary)::text[])[1 + floor(random() * 20)::int] || ' #' || i,
                    'completed', 1, t, t, t, 'results/job-' || lpad(i::text, 8, '0') || '/1.jpg', 'thumbnails/job-' || lpad(i::text, 8, '0') || '/1.jpg',
                    'uploads/bench/job-' || lpad(i::text, 8, '0') || '.jpg', '{}', 1, NULL, 4, i + 1
                FROM generate_series(0, \(items - 1)) AS i, LATERAL (SELECT ((\(now) - (\(items) - i) * 2) * 1000)::bigint AS t) AS times
                """,
                logger: logger
            )
            try await db.query(
                "INSERT INTO history_item_count (user_id, status, count) SELECT user_id, status, count(*) FROM history_item GROUP BY user_id, status",
                logger: logger
            )
            try await db.query(
                "INSERT INTO history_user (user_id, change_sequence) SELECT user_id, max(change_sequence) FROM history_item GROUP BY user_id",
                logger: logger
            )
            // Vacuumed as well as analyzed, so that the runs measure a settled table: left to
            // autovacuum, the vacuum of a million fresh rows (and the merge of the trigram indexes'
            // pending lists) ran during the measurements, and the first reads of each page wrote
            // its hint bits.
            try await db.query("VACUUM ANALYZE", logger: logger)
        }
    }
    print("filled \(items) items for \(users) users in PostgreSQL in \(started.duration(to: .now))")
}

func events(path: String, jobs: Int) async throws {
    let database = try HistoryDatabase.open(path: path)
    let start = Date()
    // 50 jobs at a time, each through its five states: a delivery holds four events of each.
    let steps: [(JobStatus, Double)] = [(.queued, 0), (.processing, 0), (.processing, 0.3), (.processing, 0.7), (.completed, 1)]
    var inserts: Duration = .zero, updates: Duration = .zero
    var insertCount = 0, updateCount = 0
    var random = SystemRandomNumberGenerator()
    for group in stride(from: 0, to: jobs, by: 50) {
        // A job's prompt and title stay as created, as they do in jobs.
        let created = (group..<min(jobs, group + 50)).map { index in
            (index, event(index: index, user: String(format: "user-%05d", index % 1000), createdAt: start.addingTimeInterval(Double(index)), random: &random))
        }
        for (step, (status, progress)) in steps.enumerated() {
            let delivery = created.map { index, first in
                var next = first
                next.job.status = status
                next.job.progress = progress
                next.job.version = step + 1
                next.job.updatedAt = start.addingTimeInterval(Double(index + step))
                if status != .completed { (next.job.resultKey, next.job.thumbnailKey, next.job.finishedAt) = (nil, nil, nil) }
                return next
            }
            let began = ContinuousClock.now
            _ = try await database.applyJobEvents(delivery)
            if step == 0 { inserts += began.duration(to: .now); insertCount += delivery.count } else { updates += began.duration(to: .now); updateCount += delivery.count }
        }
    }
    func rate(_ count: Int, _ time: Duration) -> String {
        String(format: "%.0f", Double(count) / (Double(time.components.seconds) + Double(time.components.attoseconds) / 1e18))
    }
    print("history events: \(insertCount) inserts at \(rate(insertCount, inserts))/s, \(updateCount) updates at \(rate(updateCount, updates))/s")
}

struct Claims: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

func token(secret: String, sub: String) async throws {
    let keys = JWTKeyCollection()
    await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
    print(try await keys.sign(Claims(sub: .init(value: sub), exp: .init(value: Date().addingTimeInterval(3600)))))
}

let arguments = CommandLine.arguments
switch arguments.count > 1 ? arguments[1] : "" {
case "fill" where arguments.count == 6:
    try await fill(path: arguments[2], users: Int(arguments[3]) ?? 10_000, items: Int(arguments[4]) ?? 1_000_000, bigItems: Int(arguments[5]) ?? 100_000)
case "fill-postgres" where arguments.count == 6:
    try await fillPostgres(url: arguments[2], users: Int(arguments[3]) ?? 10_000, items: Int(arguments[4]) ?? 1_000_000, bigItems: Int(arguments[5]) ?? 100_000)
case "events" where arguments.count == 4:
    try await events(path: arguments[2], jobs: Int(arguments[3]) ?? 20_000)
case "token" where arguments.count == 4:
    try await token(secret: arguments[2], sub: arguments[3])
default:
    print("usage: history-bench fill PATH USERS ITEMS BIG_ITEMS | history-bench events PATH JOBS | history-bench fill-postgres URL USERS ITEMS BIG_ITEMS | history-bench token SECRET SUB")
    exit(2)
}
