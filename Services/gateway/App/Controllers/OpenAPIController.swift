import Foundation
import Hummingbird
import Logging
import Yams

/// `GET /openapi.yaml` and `GET /openapi.json`: the contract (`openapi.yaml` at the repo root),
/// read once at start from `OPENAPI_FILE`, else `openapi.yaml` in the working folder, else the
/// repo root above the executable (`.build/<triple>/<config>/gateway`). Not found: both 404.
struct OpenAPIController<Context: RequestContext>: Sendable {
    let yaml: String?
    let json: Data?

    init(path: String?, logger: Logger) {
        let executable = URL(fileURLWithPath: CommandLine.arguments.first ?? "").resolvingSymlinksInPath()
        let candidates: [String?] = [path, FileManager.default.currentDirectoryPath + "/openapi.yaml",
                          executable.deletingLastPathComponent().appendingPathComponent("../../../openapi.yaml").standardized.path]
        let text = candidates.compactMap { $0 }.lazy.compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.first
        yaml = text
        json = text.flatMap { text in
            (try? Yams.load(yaml: text)).flatMap { try? JSONSerialization.data(withJSONObject: $0, options: [.sortedKeys, .withoutEscapingSlashes]) }
        }
        if text == nil { logger.warning("openapi.yaml not found: /openapi.yaml and /openapi.json answer 404 (set OPENAPI_FILE)") }
    }

    func addRoutes(to router: Router<Context>) {
        router.get("/openapi.yaml") { _, _ in
            guard let yaml else { throw Problem(.notFound, detail: "The contract is not installed here.") }
            return Response(status: .ok, headers: [.contentType: "application/yaml"], body: .init(byteBuffer: ByteBuffer(string: yaml)))
        }
        router.get("/openapi.json") { _, _ in
            guard let json else { throw Problem(.notFound, detail: "The contract is not installed here.") }
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: json)))
        }
    }
}
