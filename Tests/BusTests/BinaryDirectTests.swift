import Foundation
import Messages
import Testing

@testable import BinaryWire
@testable import Bus

/// The messages that write and read their binary form by hand (`BinaryDirectCodable`) against
/// their `Codable` form in the same coding: the same bytes, the same values, and the same
/// tolerance of added, missing, reordered and wrong fields.
@Suite("Binary coding: messages written by hand", .timeLimit(.minutes(5)))
struct BinaryDirectTests {
    private static let instant = Date(timeIntervalSince1970: 1_795_000_000.125)

    private static func window(_ name: String, limit: Int?, used: Int) -> QuotaWindow {
        QuotaWindow(
            name: name, limit: limit, used: used, remaining: limit.map { max(0, $0 - used) },
            startsAt: instant, resetsAt: instant.addingTimeInterval(86_400), nominalSeconds: 86_400
        )
    }

    private static let statuses: [QuotaStatus] = [
        QuotaStatus(
            userId: "user-1", plan: "free", isPro: false, timeZone: nil,
            daily: window("daily", limit: 20, used: 3), monthly: window("monthly", limit: 600, used: 40)
        ),
        QuotaStatus(
            userId: "ü-☃︎-2", plan: "pro", isPro: true, timeZone: "Europe/Berlin",
            daily: window("daily", limit: 500, used: 500), monthly: window("monthly", limit: nil, used: Int.max),
            retentionDays: 365, planEndsAt: instant.addingTimeInterval(-0.5)
        ),
        QuotaStatus(
            userId: "", plan: "", isPro: false, timeZone: "",
            daily: window("", limit: nil, used: Int.min), monthly: window("monthly", limit: -1, used: 0), retentionDays: 0
        ),
    ]

    private static let decisions: [QuotaDecision] = statuses.flatMap { status in
        [
            QuotaDecision(admitted: true, jobId: "job-1", status: status, violated: [], retryAt: nil),
            QuotaDecision(admitted: false, jobId: "", status: status, violated: ["daily", "network"], retryAt: instant, networkRemaining: 0, replayed: true,
                          idempotencyWindow: 86_400),
        ]
    }

    private static let reservations = [
        ReserveQuota(userId: "user-1", jobId: "job-1"),
        ReserveQuota(userId: "guest-2", jobId: "job-2", cost: 25, network: "v4:203.0.113.0/24"),
    ]

    private static let jobs: [JobRecord] = [
        JobRecord(
            id: "job-1", userId: "user-1", isPro: false, imageKey: "uploads/user-1/a.jpg", effectId: "copy", parameters: [:],
            prompt: nil, status: .queued, progress: 0, attempts: 0, maxAttempts: 3, lastError: nil, resultKey: nil, thumbnailKey: nil,
            createdAt: instant, updatedAt: instant, startedAt: nil, finishedAt: nil, version: 1
        ),
        JobRecord(
            id: "job-2", userId: "user-2", isPro: true, imageKey: "uploads/user-2/b.png", effectId: "video-zoom",
            parameters: ["strength": 0.75, "seed": -3], prompt: "a \"storm\" at sea", status: .failed, progress: 0.5, attempts: 3,
            maxAttempts: 3, lastError: "provider said no", resultKey: "results/job-2.mp4", thumbnailKey: "thumbnails/job-2.jpg",
            createdAt: instant, updatedAt: instant.addingTimeInterval(9.5), startedAt: instant.addingTimeInterval(1),
            finishedAt: instant.addingTimeInterval(9.5), version: 7, cancelRequested: true, credits: 25,
            submission: ProviderRequest(
                provider: "fal", requestId: "r-1", statusURL: "https://queue.fal.run/x/status", responseURL: "https://queue.fal.run/x",
                cancelURL: nil, submittedAt: instant
            ),
            traceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", imageETag: "\"9b2cf535f27731c974343645a3985328\""
        ),
    ]

    private static let pages: [RenderedHistoryPage] = [
        RenderedHistoryPage(heads: [], statuses: [], resultKeys: [], thumbnailKeys: [], totalCount: 0, hasMore: false, nextCursor: nil, sections: nil),
        RenderedHistoryPage(
            heads: [#"{"id":"a","prompt":"é"#, #"{"id":"b""#], statuses: [.completed, .failed], resultKeys: ["results/a.jpg", ""],
            thumbnailKeys: ["thumbnails/a.jpg", ""], totalCount: 90, hasMore: true, nextCursor: "eyJ0IjoxfQ",
            sections: [.init(month: "2026-11", title: "November 2026", items: [0, 1]), .init(month: "2026-10", title: "", items: [])]
        ),
    ]

    private static let listings = [
        ListHistory(userId: "user-1"),
        ListHistory(
            userId: "user-2", limit: 20, offset: 40, cursor: "c.1", statuses: [.completed, .failed], query: "sky \"blue\"", groupByMonth: true,
            timeZone: "Europe/Berlin", locale: "de"
        ),
    ]

    private static let assignments: [JobAssignment] = [
        JobAssignment(
            attempt: JobAttempt(jobId: "job-1", attempt: 1), userId: "user-1", imageKey: "uploads/user-1/a.jpg",
            effect: EffectDescription(id: "noop", title: "Nothing"), parameters: [:], prompt: nil
        ),
        JobAssignment(
            attempt: JobAttempt(jobId: "job-2", attempt: 3), userId: "user-2", imageKey: "uploads/user-2/b.png",
            effect: EffectDescription(
                id: "blur", title: "Blur", parameters: [.init(name: "radius", minimum: 0, maximum: 10, defaultValue: 2)], processor: "remote",
                endpoint: "http://127.0.0.1:9/infer"
            ),
            parameters: ["radius": 4], prompt: "soft",
            transfer: JobTransfer(
                inputURL: "http://gateway/files/uploads/user-2/b.png?exp=1&sig=s",
                result: PresignedWrite(key: "results/job-2.png", url: "http://gateway/files/results/job-2.png?owner=o&exp=1&sig=t", headers: ["Content-Type": "image/png"]),
                thumbnail: PresignedWrite(key: "thumbnails/job-2.jpg", url: "http://gateway/files/thumbnails/job-2.jpg", headers: [:]),
                expiresAt: instant
            ),
            submission: ProviderRequest(provider: "fal", requestId: "r", statusURL: "s", responseURL: "r", cancelURL: "c", submittedAt: instant),
            callbackURL: "http://gateway/api/v1/providers/fal/webhook?job=job-2", traceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            imageETag: "\"9b2cf535f27731c974343645a3985328\""
        ),
    ]

    private static let creations = [
        CreateJob(jobId: "job-1", userId: "user-1", isPro: false, imageKey: "uploads/user-1/a.jpg", effectId: "copy"),
        CreateJob(jobId: "job-2", userId: "user-2", isPro: true, imageKey: "k", effectId: "blur", parameters: ["radius": 1.5], prompt: "p", credits: 25, imageETag: "\"e1\""),
    ]

    private static let attempt = JobAttempt(jobId: "job-7", attempt: 2)
    private static let submission = ProviderRequest(provider: "fal", requestId: "r", statusURL: "s", responseURL: "r", cancelURL: nil, submittedAt: instant)

    private static let workerMessages: [WorkerMessage] = [
        .ready(WorkerReady(workerId: "w-1", capacity: 8, effects: ["copy", "blur"], heartbeatMilliseconds: 1000, prefetch: 2, batches: true)),
        .ready(WorkerReady(workerId: "w-old", capacity: 1, effects: [])),
        .heartbeat(running: []),
        .heartbeat(running: [attempt, JobAttempt(jobId: "job-8", attempt: 1)]),
        .progress(attempt, fraction: 0.25),
        .done(attempt, JobOutput(resultKey: "results/u/j.jpg", thumbnailKey: "thumbnails/u/j.jpg")),
        .failed(attempt, error: "the model answered 500", retryable: true),
        .failed(attempt, error: "", retryable: false),
        .cancelled(attempt),
        .metrics("# TYPE worker_jobs_total counter\nworker_jobs_total 3\n"),
        .leaving(returned: [attempt]),
        .renew(attempt),
        .submitted(attempt, submission),
        .answered(attempt),
    ]

    private static let dispatcherMessages: [DispatcherMessage] = assignments.map { .assign($0) } + [
        .cancel(attempt), .heartbeat, .reconnect, .refused(attempt, reason: "a stale attempt"), .recorded(attempt),
        .renewed(attempt, assignments.compactMap(\.transfer)[0]), .submissionRecorded(attempt), .poke(attempt), .leaveNoted, .batches,
    ]

    /// Both ways: the hand-written bytes are the `Codable` bytes, and each path reads the other's.
    private func expectSameAsCodable<T: BinaryDirectCodable & Equatable>(_ value: T) throws {
        let direct = try BinaryCoding.encode(value, direct: true)
        let codable = try BinaryCoding.encode(value, direct: false)
        #expect(direct == codable, "\(T.self) written by hand differs from its Codable form: \(value)")
        #expect(try BinaryCoding.decode(T.self, from: codable, direct: true) == value)
        #expect(try BinaryCoding.decode(T.self, from: direct, direct: false) == value)
        // JSON, which a client may choose, is untouched.
        #expect(try JSONDecoder().decode(T.self, from: JSONEncoder().encode(value)) == value)
    }

    @Test func everyMessageWrittenByHandHasItsCodableBytesAndValues() throws {
        for status in Self.statuses {
            try expectSameAsCodable(status)
            try expectSameAsCodable(status.daily)
            try expectSameAsCodable(status.monthly)
            try expectSameAsCodable(UserReference(userId: status.userId))
        }
        for decision in Self.decisions { try expectSameAsCodable(decision) }
        for reservation in Self.reservations { try expectSameAsCodable(reservation) }
        for job in Self.jobs { try expectSameAsCodable(job) }
        // Jobs' deliveries to history, one event and batches.
        let events = Self.jobs.map { JobEvent(job: $0, effectTitle: "Soft Focus") }
        for event in events { try expectSameAsCodable(event) }
        for batch in [JobEvents(events: events), JobEvents(events: [])] { try expectSameAsCodable(batch) }
        for page in Self.pages { try expectSameAsCodable(page) }
        for request in Self.listings { try expectSameAsCodable(request) }
        for assignment in Self.assignments {
            try expectSameAsCodable(assignment)
            try expectSameAsCodable(assignment.attempt)
            if let transfer = assignment.transfer { try expectSameAsCodable(transfer) }
            try expectSameAsCodable(assignment.effect)
            for parameter in assignment.effect.parameters { try expectSameAsCodable(parameter) }
        }
        try expectSameAsCodable(EffectDescription(
            id: "veo", title: "Video", processor: "fal", credits: 40, kind: .video, model: "fal-ai/veo3.1/image-to-video", timeoutSeconds: 600
        ))
        // An effect as an operator writes it, with only its id (or nils): each path fills the same defaults.
        for written in [try BinaryCoding.encode(["id": "sharpen"]), try BinaryCoding.encode(["id": "sharpen", "title": nil, "kind": nil] as [String: String?])] {
            let direct = try BinaryCoding.decode(EffectDescription.self, from: written, direct: true)
            #expect(direct == (try BinaryCoding.decode(EffectDescription.self, from: written, direct: false)))
            #expect(direct == EffectDescription(id: "sharpen", title: "sharpen"))
        }
        for creation in Self.creations { try expectSameAsCodable(creation) }
        // A creation's trace is the jobs service's to set: never sent, either way.
        var traced = Self.creations[0]
        traced.traceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        #expect(try BinaryCoding.encode(traced, direct: true) == BinaryCoding.encode(Self.creations[0], direct: false))
        // The worker protocol's messages, every case, alone and in batches.
        for message in Self.workerMessages + [.all(Self.workerMessages), .all([])] { try expectSameAsCodable(message) }
        for message in Self.dispatcherMessages + [.all(Self.dispatcherMessages), .all([])] { try expectSameAsCodable(message) }
        try expectSameAsCodable(JobOutput(resultKey: "results/u/j.jpg", thumbnailKey: "thumbnails/u/j.jpg"))
        // The job streams' watch, both ways.
        let seen = [WatchJobs.Seen(jobId: "job-1", userId: "user-1", version: 3, progress: 0.5), WatchJobs.Seen(jobId: "j", userId: "u", version: 1, progress: 0)]
        for request in [WatchJobs(jobs: seen), WatchJobs(jobs: [])] { try expectSameAsCodable(request) }
        for answer in [WatchedJobs(changed: Self.jobs, gone: ["gone-1", "gone-2"]), WatchedJobs(changed: [], gone: [])] { try expectSameAsCodable(answer) }
        // Inside a message that stays Codable (the admin's usage view), and as a dictionary's values.
        let usage = UserUsage(status: Self.statuses[1], charges: [])
        #expect(try BinaryCoding.encode(usage, direct: true) == BinaryCoding.encode(usage, direct: false))
        #expect(try BinaryCoding.decode(UserUsage.self, from: BinaryCoding.encode(usage)) == usage)
        let byName = ["a": Self.statuses[0].daily, "b": Self.statuses[1].monthly]
        #expect(try BinaryCoding.decode([String: QuotaWindow].self, from: BinaryCoding.encode(byName, direct: false)) == byName)
    }

    /// One value of each message written by hand with every field set, optionals included.
    private static var fullValues: [any BinaryDirectCodable & Encodable] {
        let assignment = assignments[1]
        return [
            UserReference(userId: "user-1"), statuses[1], statuses[1].daily, decisions[3], reservations[1], jobs[1], pages[1], listings[1],
            creations[1], JobEvent(job: jobs[1], effectTitle: "Soft Focus"), JobEvents(events: [JobEvent(job: jobs[1], effectTitle: "t")]),
            attempt, assignment.transfer!.result, assignment.transfer!, assignment, assignment.effect.parameters[0],
            EffectDescription(
                id: "veo", title: "Video", parameters: [.init(name: "seconds", minimum: 4, maximum: 8, defaultValue: 4)], processor: "fal",
                endpoint: "https://fal.example/veo", credits: 40, kind: .video, model: "fal-ai/veo3.1/image-to-video", timeoutSeconds: 600
            ),
            JobOutput(resultKey: "r", thumbnailKey: "t"), WatchJobs.Seen(jobId: "j", userId: "u", version: 1, progress: 0.5),
            WatchJobs(jobs: [WatchJobs.Seen(jobId: "j", userId: "u", version: 1, progress: 0.5)]), WatchedJobs(changed: jobs, gone: ["g"]),
        ]
    }

    /// Stored properties no peer ever sends, in either form (their `CodingKeys` leave them out).
    private static let neverSent: [String: Set<String>] = ["CreateJob": ["traceParent"]]

    /// A stored property added to a message written by hand must reach its binary form: the full
    /// values set every stored property (so a new optional that no value sets fails here), each
    /// stored property is a field of its `Codable` form, and the hand-written bytes are the
    /// `Codable` bytes (so a field `writeBinary` leaves out fails there).
    @Test func everyStoredPropertyOfAMessageWrittenByHandIsInItsBinaryForm() throws {
        for value in Self.fullValues {
            let type = "\(Swift.type(of: value))"
            let skipped = Self.neverSent[type] ?? []
            let properties = Mirror(reflecting: value).children.compactMap(\.label).filter { !skipped.contains($0) }
            #expect(!properties.isEmpty, "\(type) has no stored property")
            for child in Mirror(reflecting: value).children where !skipped.contains(child.label ?? "") {
                let inner = Mirror(reflecting: child.value)
                #expect(!(inner.displayStyle == .optional && inner.children.isEmpty), "the full \(type) leaves \(child.label ?? "?") nil: set it")
            }
            let json = try JSONSerialization.jsonObject(with: JSONEncoder().encode(value)) as? [String: Any] ?? [:]
            let missing = Set(properties).subtracting(json.keys)
            #expect(missing.isEmpty, "\(type)'s Codable form leaves out \(missing.sorted()); if no peer should send them, list them in neverSent")
            #expect(try BinaryCoding.encode(value, direct: true) == BinaryCoding.encode(value, direct: false), "\(type) written by hand differs from its Codable form")
        }
    }

    /// A window as a newer peer might send it: its fields in another order, a field added (a
    /// container, skipped whole), and the optionals written as nil instead of left out.
    private struct ReorderedWindow: Encodable {
        var nominalSeconds: Int
        var added: [String: [Int]]
        var resetsAt: Date
        var startsAt: Date
        var remaining: Int?
        var used: Int
        var limit: Int?
        var name: String

        func encode(to encoder: any Encoder) throws {
            enum Keys: String, CodingKey { case nominalSeconds, added, resetsAt, startsAt, remaining, used, limit, name }
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(nominalSeconds, forKey: .nominalSeconds)
            try container.encode(added, forKey: .added)
            try container.encode(resetsAt, forKey: .resetsAt)
            try container.encode(startsAt, forKey: .startsAt)
            try container.encode(remaining, forKey: .remaining)
            try container.encode(used, forKey: .used)
            try container.encode(limit, forKey: .limit)
            try container.encode(name, forKey: .name)
        }
    }

    @Test func fieldsInAnyOrderAddedOrNilReadAsCodableReadsThem() throws {
        let sent = ReorderedWindow(
            nominalSeconds: 2_592_000, added: ["k": [1, 2, 3]], resetsAt: Self.instant, startsAt: Self.instant.addingTimeInterval(-60),
            remaining: nil, used: 7, limit: nil, name: "monthly"
        )
        let bytes = try BinaryCoding.encode(sent)
        let direct = try BinaryCoding.decode(QuotaWindow.self, from: bytes, direct: true)
        #expect(direct == (try BinaryCoding.decode(QuotaWindow.self, from: bytes, direct: false)))
        #expect(direct == QuotaWindow(name: "monthly", limit: nil, used: 7, remaining: nil, startsAt: sent.startsAt, resetsAt: sent.resetsAt, nominalSeconds: 2_592_000))
    }

    @Test func aMissingOrWronglyTypedFieldIsTheErrorCodableGives() throws {
        struct Partial: Encodable { var name = "daily"; var limit = 3; var remaining = 1; var startsAt = Date(); var resetsAt = Date(); var nominalSeconds = 1 }
        for direct in [true, false] {
            do {
                _ = try BinaryCoding.decode(QuotaWindow.self, from: BinaryCoding.encode(Partial()), direct: direct)
                Issue.record("decoded a window without 'used'")
            } catch DecodingError.keyNotFound(let key, _) {
                #expect(key.stringValue == "used")
            }
        }
        // A nested window missing a field: the error names the path down to it.
        struct StatusWithPartial: Encodable {
            var userId = "u", plan = "free", isPro = false, daily = Partial(), monthly = Partial(), retentionDays = 30
        }
        do {
            _ = try BinaryCoding.decode(QuotaStatus.self, from: BinaryCoding.encode(StatusWithPartial()))
            Issue.record("decoded a status whose windows lack 'used'")
        } catch DecodingError.keyNotFound(let key, let context) {
            #expect(key.stringValue == "used")
            #expect(context.codingPath.map(\.stringValue) == ["daily"])
        }
        // A string where a number goes, and nil where a value is required.
        struct WrongType: Encodable { var userId = 42 }
        struct NilRequired: Encodable {
            var userId: String? = nil
            func encode(to encoder: any Encoder) throws {
                enum Keys: CodingKey { case userId }
                var container = encoder.container(keyedBy: Keys.self)
                try container.encodeNil(forKey: .userId)
            }
        }
        for direct in [true, false] {
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(UserReference.self, from: BinaryCoding.encode(WrongType()), direct: direct) }
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(UserReference.self, from: BinaryCoding.encode(NilRequired()), direct: direct) }
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(QuotaStatus.self, from: BinaryCoding.encode(["userId"]), direct: direct) }
        }
    }

    @Test func aJobWrittenBeforePricesAndCancelsReadsWithTheirDefaults() throws {
        // A job as an older jobs service wrote it: no `credits`, no `cancelRequested`.
        struct OldJob: Encodable {
            var id = "job-old", userId = "u", isPro = false, imageKey = "k", effectId = "copy", parameters: [String: Double] = [:]
            var status = "completed", progress = 1.0, attempts = 1, maxAttempts = 3, createdAt = Date(), updatedAt = Date(), version = 4
        }
        let bytes = try BinaryCoding.encode(OldJob())
        let direct = try BinaryCoding.decode(JobRecord.self, from: bytes, direct: true)
        #expect(direct == (try BinaryCoding.decode(JobRecord.self, from: bytes, direct: false)))
        #expect(direct.credits == Jobs.defaultCredits && !direct.cancelRequested && direct.status == .completed)
        // A status this version does not know is an error either way, not a guess.
        var unknown = OldJob()
        unknown.status = "paused"
        for path in [true, false] {
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(JobRecord.self, from: BinaryCoding.encode(unknown), direct: path) }
        }
    }

    @Test func aWorkerProtocolMessageOfNoCaseOrTwoIsTheErrorCodableGives() throws {
        struct Cases: Encodable {
            var names: [String]
            func encode(to encoder: any Encoder) throws {
                var container = encoder.container(keyedBy: DictionaryKey.self)
                for name in names { _ = container.nestedContainer(keyedBy: DictionaryKey.self, forKey: DictionaryKey(name)) }
            }
        }
        for names in [[], ["unknownCase"], ["heartbeat", "reconnect"]] {
            for direct in [true, false] {
                #expect {
                    try BinaryCoding.decode(DispatcherMessage.self, from: BinaryCoding.encode(Cases(names: names)), direct: direct)
                } throws: { error in
                    guard case DecodingError.typeMismatch(let type, _) = error else { return false }
                    return type == DispatcherMessage.self
                }
            }
        }
        // A known case among unknown ones is that case (a newer peer's cases are not counted)
        #expect(try BinaryCoding.decode(DispatcherMessage.self, from: BinaryCoding.encode(Cases(names: ["newer", "heartbeat"]))) == .heartbeat)
        // A case's values must be a keyed container; a missing value is the key Codable names
        for direct in [true, false] {
            #expect(throws: DecodingError.self) {
                try BinaryCoding.decode(DispatcherMessage.self, from: BinaryCoding.encode(["heartbeat": 1]), direct: direct)
            }
            #expect {
                try BinaryCoding.decode(WorkerMessage.self, from: BinaryCoding.encode(Cases(names: ["done"])), direct: direct)
            } throws: { error in
                guard case DecodingError.keyNotFound(let key, let context) = error else { return false }
                return key.stringValue == "_0" && context.codingPath.map(\.stringValue) == ["done"]
            }
        }
    }

    /// Any shape of keyed containers, arrays and strings, to write what no message would.
    private indirect enum Tree: Encodable {
        case keyed([String: Tree]), list([Tree]), text(String)

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .keyed(let fields): try container.encode(fields)
            case .list(let values): try container.encode(values)
            case .text(let text): try container.encode(text)
            }
        }
    }

    @Test func anErrorDeepInsideMessagesReadByHandHasTheWholePathCodableGives() throws {
        // Given a batch whose second message is a cancel naming an attempt without its number
        let empty = Tree.keyed([:])
        let broken = Tree.keyed(["all": .keyed(["_0": .list([
            .keyed(["heartbeat": empty]),
            .keyed(["cancel": .keyed(["_0": .keyed(["jobId": .text("j")])])]),
        ])])])
        let bytes = try BinaryCoding.encode(broken)
        // Then both paths name the same key at the same path
        var paths: [[String]] = []
        for direct in [true, false] {
            #expect {
                try BinaryCoding.decode(DispatcherMessage.self, from: bytes, direct: direct)
            } throws: { error in
                guard case DecodingError.keyNotFound(let key, let context) = error, key.stringValue == "attempt" else { return false }
                paths.append(context.codingPath.map(\.stringValue))
                return true
            }
        }
        #expect(paths.count == 2 && paths[0] == paths[1] && paths[0] == ["all", "_0", "1", "cancel", "_0"], "\(paths)")
    }

    @Test func garbageNeverCrashesAMessageWrittenByHand() throws {
        var generator = SystemRandomNumberGenerator()
        let valid = try BinaryCoding.encode(Self.decisions[3])
        for length in 0..<valid.count {
            #expect(throws: DecodingError.self) { try BinaryCoding.decode(QuotaDecision.self, from: Array(valid.prefix(length))) }
        }
        for _ in 0..<5000 {
            _ = try? BinaryCoding.decode(QuotaDecision.self, from: corrupted(valid, using: &generator))
            let random = (0..<Int.random(in: 0...80, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = try? BinaryCoding.decode(QuotaStatus.self, from: random)
        }
        for valid in [try BinaryCoding.encode(WorkerMessage.all(Self.workerMessages)), try BinaryCoding.encode(DispatcherMessage.all(Self.dispatcherMessages))] {
            for _ in 0..<3000 {
                let bytes = corrupted(valid, using: &generator)
                _ = try? BinaryCoding.decode(WorkerMessage.self, from: bytes)
                _ = try? BinaryCoding.decode(DispatcherMessage.self, from: bytes)
            }
        }
        for valid in [try BinaryCoding.encode(Self.jobs[1]), try BinaryCoding.encode(Self.pages[1]), try BinaryCoding.encode(Self.listings[1])] {
            for _ in 0..<3000 {
                let bytes = corrupted(valid, using: &generator)
                _ = try? BinaryCoding.decode(JobRecord.self, from: bytes)
                _ = try? BinaryCoding.decode(RenderedHistoryPage.self, from: bytes)
                _ = try? BinaryCoding.decode(JobEvents.self, from: bytes)
                _ = try? BinaryCoding.decode(ListHistory.self, from: bytes)
            }
        }
    }
}
