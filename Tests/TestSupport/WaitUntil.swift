/// Polls `condition` every 5 ms until it holds, throwing `WaitTimedOut` after `limit`: the tests'
/// way to wait for a condition rather than for a fixed time.
public func waitUntil(within limit: Duration = .seconds(60), _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now.advanced(by: limit)
    while try await !condition() {
        guard ContinuousClock.now < deadline else { throw WaitTimedOut() }
        try await Task.sleep(for: .milliseconds(5))
    }
}

public struct WaitTimedOut: Error {}
