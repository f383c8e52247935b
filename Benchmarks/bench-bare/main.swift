import Foundation
import Hummingbird
import Logging

// The baseline of `make bench-gateway`: a bare Hummingbird server with one route answering what
// the gateway's `/healthz` answers, no middleware, logs at warning. Usage: bench-bare PORT
let port = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 8090 : 8090
var logger = Logger(label: "bench-bare")
logger.logLevel = .warning
let router = Router()
router.get("/healthz") { _, _ in
    Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: #"{"status":"ok"}"#)))
}
let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: "bare"), logger: logger)
try await app.runService()
