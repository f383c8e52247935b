import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// The operators' console at `/admin`: three static files carried in the binary
/// (`ConsoleAssets`), which call the admin API with the token the operator types. No token is
/// needed for the files themselves: they hold nothing but the page. A strict content security
/// policy lets the page load only its own script and style, talk only to this origin, and show
/// images only from it or from the blob: URLs it makes of files it fetched.
struct ConsoleController<Context: GatewayRequestContext>: Sendable {
    static var securityHeaders: HTTPFields { [
        .contentSecurityPolicy: "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        .xContentTypeOptions: "nosniff",
        HTTPField.Name("Referrer-Policy")!: "no-referrer",
        .cacheControl: "no-cache",
    ] }

    func addRoutes(to router: Router<Context>) {
        for (path, type, body) in [
            ("/admin", "text/html; charset=utf-8", ConsoleAssets.indexHTML),
            ("/admin/console.css", "text/css; charset=utf-8", ConsoleAssets.css), ("/admin/console.js", "text/javascript; charset=utf-8", ConsoleAssets.javascript),
        ] {
            let bytes = ByteBuffer(string: body)
            router.get(RouterPath(path)) { _, _ in
                var headers = Self.securityHeaders
                headers[.contentType] = type
                return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: bytes))
            }
        }
    }
}
