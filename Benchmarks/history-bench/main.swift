import Foundation
import HistoryService
import JWTKit
import Messages

// History benchmark helper.
//   history-bench fill PATH USERS ITEMS BIG_ITEMS
//     fills a history database with ITEMS completed items of USERS users, BIG_ITEMS of them for
//     `user-big`, the rest spread over `user-00000`...; prompts from a small vocabulary, one item a
//     minute back from now. Writes go through HistoryDatabase's own method for job events.
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
case "token" where arguments.count == 4:
    try await token(secret: arguments[2], sub: arguments[3])
default:
    print("usage: history-bench fill PATH USERS ITEMS BIG_ITEMS | history-bench token SECRET SUB")
    exit(2)
}
