/// The deadline of the bus request being handled (`BusServer` sets it per request, from the
/// envelope): work done for it, such as a store's database operation, gives up in time for its
/// answer to reach the caller. Nil outside a request.
public enum BusDeadline {
    @TaskLocal public static var current: ContinuousClock.Instant?

    /// What is left of the current request's deadline, less `margin` for the answer to travel;
    /// nil outside a request.
    public static func remaining(less margin: Duration) -> Duration? {
        current.map { ContinuousClock.now.duration(to: $0) - margin }
    }
}
