import Bus
import Foundation
import Messages
import ServiceKit
import Synchronization
import Testing

@Suite("Quota service process", .serialized, .timeLimit(.minutes(5)))
struct QuotaProcessTests {
    @Test func twoHundredConcurrentReservesForOneFreeUserAdmitExactlyTwenty() async throws {
        // Given the real quota process and a free user with a fresh quota
        let services = try RunningServices(only: [.quota])
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!)) { client in
            _ = try await waitUntilHealthy(client)
            // When 200 reserves are sent at once over the bus
            let outcomes = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<200 {
                    group.addTask {
                        try await client.call(Quota.reserve, ReserveQuota(userId: "device:burst", jobId: "burst-\(index)")).admitted
                    }
                }
                return try await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            // Then exactly 20 are admitted and 180 denied
            #expect(outcomes.filter { $0 }.count == 20)
            #expect(outcomes.filter { !$0 }.count == 180)
            let status = try await client.call(Quota.status, UserReference(userId: "device:burst"))
            #expect(status.daily.used == 20)
        }
        await services.stopAll()
    }

    @Test func admissionsSurviveKillNineOfTheQuotaProcess() async throws {
        // Given admissions the quota process has answered yes to
        let services = try RunningServices(only: [.quota])
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!)) { client in
            _ = try await waitUntilHealthy(client)
            let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<15 {
                    group.addTask { try await client.call(Quota.reserve, ReserveQuota(userId: "durable", jobId: "d-\(index)")).admitted }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(admitted == 15)
            // When the process is killed outright right after, and started again on the same data
            services.processes[.quota]!.signal(SIGKILL)
            _ = try await services.processes[.quota]!.waitForExit()
            try services.start(.quota)
            _ = try await waitUntilHealthy(client)
            // Then every admission is still there, exactly
            let usage = try await client.call(Quota.usage, UserReference(userId: "durable"))
            #expect(usage.status.daily.used == 15)
            #expect(usage.status.monthly.used == 15)
            #expect(usage.charges.count == 15)
            // And re-sending one of the admitted job ids charges nothing more
            _ = try await client.call(Quota.reserve, ReserveQuota(userId: "durable", jobId: "d-3"))
            #expect(try await client.call(Quota.status, UserReference(userId: "durable")).daily.used == 15)
        }
        await services.stopAll()
    }

    @Test func killNineInTheMiddleOfABatchLosesNoAnsweredChangeAndTheRestartRebuildsMemoryExactly() async throws {
        // Given 48 callers reserving, then committing or releasing, for 40 free users as fast as
        // the quota process answers
        let services = try RunningServices(only: [.quota])
        let users = (0..<40).map { "kill-\($0)" }
        final class Callers: Sendable {
            let answered = Mutex<[String: (user: String, state: Charge.State)]>([:])
            let stop = Atomic<Bool>(false)
        }
        let callers = Callers()
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!, defaultTimeout: .seconds(3))) { client in
            _ = try await waitUntilHealthy(client)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for caller in 0..<48 {
                    group.addTask {
                        var step = 0
                        while !callers.stop.load(ordering: .relaxed) {
                            step += 1
                            let user = users[(caller * 7 + step) % users.count], job = "k-\(caller)-\(step)"
                            do {
                                let decision = try await client.call(Quota.reserve, ReserveQuota(userId: user, jobId: job, cost: 1 + step % 3))
                                guard decision.admitted else { continue }
                                callers.answered.withLock { $0[job] = (user, .reserved) }
                                if step % 2 == 0 {
                                    _ = try await client.call(Quota.commit, ChargeReference(jobId: job))
                                    callers.answered.withLock { $0[job] = (user, .committed) }
                                } else {
                                    _ = try await client.call(Quota.release, ChargeReference(jobId: job))
                                    callers.answered.withLock { $0[job] = (user, .released) }
                                }
                            } catch {
                                return  // the process is gone: what was answered is what counts
                            }
                        }
                    }
                }
                // When the process is killed outright while batches are being decided and written
                try await waitUntil(within: .seconds(30)) { callers.answered.withLock { $0.count } >= 600 }
                services.processes[.quota]!.signal(SIGKILL)
                callers.stop.store(true, ordering: .relaxed)
                try await group.waitForAll()
            }
            _ = try await services.processes[.quota]!.waitForExit()
            try services.start(.quota)
            _ = try await waitUntilHealthy(client)

            // Then every change anyone heard of is there: an answered reserve is charged (settled
            // since, perhaps, by a call in flight), an answered commit or release is so
            let heard = callers.answered.withLock { $0 }
            var charges: [String: Charge] = [:]
            for user in users {
                let usage = try await client.call(Quota.usage, UserReference(userId: user))
                #expect(usage.charges.count < 100, "a user has too many charges for one page")
                for charge in usage.charges { charges[charge.jobId] = charge }
                // And memory, rebuilt after the restart, counts exactly the charges not released
                let today = usage.status.daily.startsAt
                let held = usage.charges.filter { $0.state != .released && $0.reservedAt >= today }.reduce(0) { $0 + $1.cost }
                #expect(usage.status.daily.used == held, "\(user): \(usage.status.daily.used) used, charges hold \(held)")
                #expect(usage.status.daily.used <= 20)
            }
            for (job, (user, state)) in heard {
                let charge = try #require(charges[job], "\(job), answered \(state), is missing after the restart")
                #expect(charge.userId == user)
                if state != .reserved { #expect(charge.state == state, "\(job): answered \(state), now \(charge.state)") }
            }
            print("kill -9 in a batch: \(heard.count) answered charges, all there after the restart; \(charges.count) in all")
        }
        await services.stopAll()
    }

    @Test func badInputOverTheBusGetsTypedErrorsAndChargesNothing() async throws {
        let services = try RunningServices(only: [.quota])
        try await withBusClient(.init(endpoint: services.endpoints[.quota]!)) { client in
            _ = try await waitUntilHealthy(client)
            func code(_ request: ReserveQuota) async -> BusError.Code? {
                do throws(BusError) { _ = try await client.call(Quota.reserve, request); return nil } catch { return error.code }
            }
            #expect(await code(ReserveQuota(userId: "x", jobId: "j", cost: 0)) == .badRequest)
            #expect(await code(ReserveQuota(userId: "x", jobId: "j", cost: -1)) == .badRequest)
            #expect(await code(ReserveQuota(userId: String(repeating: "x", count: 5000), jobId: "j")) == .badRequest)
            do throws(BusError) {
                _ = try await client.call(Quota.setPlan, SetPlan(userId: "x", plan: "gold"))
                Issue.record("unknown plan accepted")
            } catch {
                #expect(error.code == Quota.ErrorCode.unknownPlan)
            }
            #expect(try await client.call(Quota.status, UserReference(userId: "x")).daily.used == 0)
        }
        await services.stopAll()
    }
}
