import Foundation
import JobsCore
@testable import JobsService
import Messages
import Testing

/// Devices and the push notices of ended jobs, on both stores: a job that completes or fails
/// writes one notice per device of its user (on a platform push is on for) in the transaction that
/// ends it, through every path a job ends by.
@Suite("Devices and push notices", .timeLimit(.minutes(2)))
struct DeviceStoreTests {
    static func notices(_ harness: JobsStoreHarness) async throws -> [PushNotice] {
        try await harness.outbox().filter { $0.topic == "push" }.map { try JSONDecoder().decode(PushNotice.self, from: $0.payload ?? Data()) }
    }

    @Test(arguments: JobsBackend.allCases) func aJobThatEndsWritesOneNoticePerDeviceOfItsUser(backend: JobsBackend) async throws {
        try await withJobsStore(backend, pushPlatforms: [.apns]) { harness in
            let store = harness.store, now = harness.now
            _ = try await store.putDevice(DeviceRegistration(userId: "alice", token: "a-phone", platform: .apns, environment: .sandbox), now: now)
            _ = try await store.putDevice(DeviceRegistration(userId: "alice", token: "a-android", platform: .fcm), now: now)
            _ = try await store.putDevice(DeviceRegistration(userId: "bob", token: "b-phone", platform: .apns), now: now)
            // A token registered again by someone else moves to them
            _ = try await store.putDevice(DeviceRegistration(userId: "bob", token: "moved", platform: .apns), now: now)
            _ = try await store.putDevice(DeviceRegistration(userId: "alice", token: "moved", platform: .apns), now: now.addingTimeInterval(1))
            #expect(try await store.deleteDevice(userId: "bob", token: "moved") == false)
            #expect(try await store.deleteDevice(userId: "bob", token: "a-phone") == false, "someone else's device")

            // Completed, through the dispatcher's batch path
            _ = try await harness.created("done", user: "alice")
            _ = try #require(try await store.start("done", now: now))
            _ = try await store.complete(JobAttempt(jobId: "done", attempt: 1), output: JobOutput(resultKey: "r", thumbnailKey: "t"), now: now)
            var notices = try await Self.notices(harness)
            // One per device of Alice's on APNs (push is on for APNs only here), none for Bob
            #expect(Set(notices.map(\.token)) == ["a-phone", "moved"] && notices.count == 2, "\(notices)")
            #expect(notices.allSatisfy { $0.jobId == "done" && $0.status == .completed && $0.userId == "alice" })
            #expect(notices.first { $0.token == "a-phone" }?.environment == .sandbox)

            // Failed when its worker is lost with no attempt left (requeue's path)
            _ = try await harness.created("lost", user: "alice")
            for attempt in 1...3 {
                _ = try #require(try await store.start("lost", now: now))
                _ = try await store.requeue(JobAttempt(jobId: "lost", attempt: attempt), reason: "worker lost", now: now)
            }
            #expect(try await store.job("lost", userId: nil)?.status == .failed)
            notices = try await Self.notices(harness)
            #expect(notices.filter { $0.jobId == "lost" && $0.status == .failed }.count == 2, "\(notices)")

            // Cancelled: the user did it, no notice
            _ = try await harness.created("cancelled", user: "alice")
            _ = try await store.cancel("cancelled", userId: "alice", now: now)
            #expect(try await Self.notices(harness).filter { $0.jobId == "cancelled" }.isEmpty)

            // A device removed, or forgotten as unregistered, hears of nothing more
            #expect(try await store.deleteDevice(userId: "alice", token: "a-phone"))
            try await store.forgetDevice(token: "moved")
            _ = try await harness.created("later", user: "alice")
            _ = try #require(try await store.start("later", now: now))
            _ = try await store.complete(JobAttempt(jobId: "later", attempt: 1), output: JobOutput(resultKey: "r2", thumbnailKey: "t2"), now: now)
            #expect(try await Self.notices(harness).filter { $0.jobId == "later" }.isEmpty)
        }
    }

    @Test(arguments: JobsBackend.allCases) func aUserKeepsTheirLatestDevicesUpToTheLimit(backend: JobsBackend) async throws {
        try await withJobsStore(backend) { harness in
            for index in 0..<(Devices.maxPerUser + 3) {
                _ = try await harness.store.putDevice(DeviceRegistration(userId: "carol", token: "t\(index)", platform: .fcm),
                                                      now: harness.now.addingTimeInterval(Double(index)))
            }
            // The three registered longest ago are forgotten; the latest are kept
            for index in 0..<3 { #expect(try await harness.store.deleteDevice(userId: "carol", token: "t\(index)") == false) }
            #expect(try await harness.store.deleteDevice(userId: "carol", token: "t\(Devices.maxPerUser + 2)"))
            #expect(try await harness.store.deleteDevice(userId: "carol", token: "t3"))
        }
    }
}
