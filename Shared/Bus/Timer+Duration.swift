import Metrics

extension Metrics.Timer {
    /// Records `duration` (swift-metrics takes nanoseconds).
    public func record(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        recordNanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}
