/// The defaults that more than one process reads, each written once: every process's
/// configuration (and the load test's) takes them from here. Each names its variable.
public enum SharedDefaults {
    /// `GATEWAY_HOST`: where the gateway listens.
    public static let gatewayHost = "127.0.0.1"
    /// `GATEWAY_PORT`.
    public static let gatewayPort = 8080
    /// `URL_SIGNING_SECRET`: good for one machine only (README, "Production").
    public static let urlSigningSecret = "development-url-signing-secret"
    /// `DATA_DIR`: each service's files, and the folder store's blobs below it.
    public static let dataDirectory = ".data"
    /// `QUOTA_MAX_IN_FLIGHT`, `HISTORY_MAX_IN_FLIGHT`, `JOBS_MAX_IN_FLIGHT`: the requests a bus
    /// server runs at once.
    public static let maxInFlight = 1024

    /// `PUBLIC_BASE_URL` when it is unset: the gateway as clients would reach it, at the address
    /// it listens on. On every interface (0.0.0.0, ::) there is no such name, and loopback stands
    /// in: `guessed` (the gateway logs it at start).
    public static func publicBaseURL(host: String, port: Int) -> (url: String, guessed: Bool) {
        let everyInterface = ["0.0.0.0", "::", "[::]", "*", ""].contains(host)
        return ("http://\(everyInterface ? "127.0.0.1" : host):\(port)", everyInterface)
    }
}
