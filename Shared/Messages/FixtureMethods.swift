/// Methods of the test fixture service (`bus-fixture`), used by the system tests to exercise the
/// bus with real processes. No production service registers them.
public enum FixtureMethods {
    /// Answers with the string it was sent.
    public static let echo = BusMethod<String, String>("fixture.echo", roles: Set(BusRole.known))
    /// Waits the given number of milliseconds, then answers with it.
    public static let sleep = BusMethod<Int, Int>("fixture.sleep", roles: Set(BusRole.known))
    /// Waits the given number of milliseconds, then answers with the process id of the replica
    /// that answered; safe to send again.
    public static let replica = BusMethod<Int, Int32>("fixture.replica", roles: Set(BusRole.known), retrySafe: true)
}
