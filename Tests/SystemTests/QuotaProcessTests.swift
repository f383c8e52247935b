import Bus
import Foundation
import Messages
import ServiceKit
import Testing

@Suite("Quota service process", .serialized)
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
