/// The trace id of the request being handled, carried in every bus envelope this task sends.
public enum BusTrace {
    /// The current trace id: set by the gateway per HTTP request and by `BusServer` per handled
    /// request, so calls a handler makes carry the id of the request that caused them.
    @TaskLocal public static var id: String = ""
}
