import Foundation
import Messages
import Testing

import BinaryWire
@testable import Bus

@Suite("Bus round trips", .timeLimit(.minutes(5)))
struct BusRoundTripTests {
    @Test func requestOverInprocGetsItsReply() async throws {
        // Given a server on an inproc endpoint
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                // When a caller sends one request
                let reply = try await client.call(TestMethods.echo, Tagged(tag: 7, text: "hello"))
                // Then it gets its own reply back
                #expect(reply == Tagged(tag: 7, text: "hello"))
            }
        }
    }

    @Test func thousandConcurrentRequestsEachReachTheirOwnCaller() async throws {
        // Given a server and one client
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                // When 1,000 callers send at once on the same socket
                let mismatches = try await withThrowingTaskGroup(of: Int.self) { group in
                    for tag in 0..<1000 {
                        group.addTask {
                            let reply = try await client.call(TestMethods.echo, Tagged(tag: tag, text: "caller \(tag)"))
                            return reply == Tagged(tag: tag, text: "caller \(tag)") ? 0 : 1
                        }
                    }
                    return try await group.reduce(0, +)
                }
                // Then every reply carries its caller's own tag
                #expect(mismatches == 0)
            }
        }
    }

    @Test func unknownMethodGetsATypedError() async throws {
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                let error = await failure(client, BusMethod<Tagged, Tagged>("test.nothing", roles: Set(BusRole.known)), Tagged(tag: 1, text: ""))
                #expect(error?.code == .unknownMethod)
                #expect(error?.retryable == false)
            }
        }
    }

    @Test func undecodableBodyGetsBadRequest() async throws {
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                // When the body is not JSON, then is JSON of the wrong shape, then neither in binary
                let garbage = await client.send(method: TestMethods.echo.name, body: Array("{not json".utf8), encoding: .json, timeout: .seconds(5))
                let wrongShape = await client.send(method: TestMethods.echo.name, body: Array(#"{"tag":"seven"}"#.utf8), encoding: .json, timeout: .seconds(5))
                let binaryGarbage = await client.send(method: TestMethods.echo.name, body: [9, 200, 0, 0, 0, 1], encoding: .binary, timeout: .seconds(5))
                let binaryWrongShape = await client.send(
                    method: TestMethods.echo.name, body: try BinaryCoding.encode(["tag": "seven"]), encoding: .binary, timeout: .seconds(5)
                )
                // Then all are typed bad_request errors, and the server still answers
                for outcome in [garbage, wrongShape, binaryGarbage, binaryWrongShape] {
                    guard case .failure(let error) = outcome else {
                        Issue.record("expected a failure, got \(outcome)")
                        continue
                    }
                    #expect(error.code == .badRequest)
                }
                if case .failure(let error) = wrongShape { #expect(error.message.contains("tag")) }
                if case .failure(let error) = binaryWrongShape { #expect(error.message.contains("tag")) }
                let reply = try await client.call(TestMethods.echo, Tagged(tag: 1, text: "still here"))
                #expect(reply.text == "still here")
            }
        }
    }

    @Test func replyOfTheWrongTypeIsBadReply() async throws {
        let endpoint = uniqueInproc()
        try await withServer(endpoint: endpoint) { _ in
            try await withClient(endpoint: endpoint) { client in
                // A descriptor that disagrees with the server's reply type
                let mismatched = BusMethod<Tagged, [String]>(TestMethods.echo.name, roles: Set(BusRole.known))
                let error = await failure(client, mismatched, Tagged(tag: 1, text: "x"))
                #expect(error?.code == .badReply)
            }
        }
    }

    @Test func serviceErrorsArriveWithCodeMessageAndRetryable() async throws {
        let endpoint = uniqueInproc()
        var router = BusRouter()
        router.register(TestMethods.echo) { _, _ in
            throw BusError(.init("test.denied"), "over the limit", retryable: true)
        }
        try await withServer(endpoint: endpoint, router: router) { _ in
            try await withClient(endpoint: endpoint) { client in
                let error = await failure(client, TestMethods.echo, Tagged(tag: 1, text: ""))
                #expect(error == BusError(.init("test.denied"), "over the limit", retryable: true))
            }
        }
    }

    @Test func traceIdTravelsToTheHandler() async throws {
        let endpoint = uniqueInproc()
        var router = BusRouter()
        router.register(BusMethod<Empty, String>("test.trace", roles: Set(BusRole.known))) { _, context in
            "\(context.traceId)|\(BusTrace.id)"
        }
        try await withServer(endpoint: endpoint, router: router) { _ in
            try await withClient(endpoint: endpoint) { client in
                let seen = try await BusTrace.$id.withValue("req-42") {
                    try await client.call(BusMethod<Empty, String>("test.trace", roles: Set(BusRole.known)), Empty())
                }
                #expect(seen == "req-42|req-42")
            }
        }
    }
}
