import HTTPTypes
import Hummingbird

/// Answers 405 with an `Allow` header when a request's path is one of the gateway's routes but
/// its method is not one the route takes (RFC 9110 §15.5.6); Hummingbird's router answers 404
/// for both. Added to the router after every route, so it wraps only the router's not-found
/// responder: a handler's own 404 (an unknown id) passes through untouched.
struct MethodNotAllowedMiddleware<Context: RequestContext>: RouterMiddleware {
    private struct Route: Sendable {
        let path: RouterPath
        let methods: [HTTPRequest.Method]
    }
    private let routes: [Route]

    /// The table of `router`'s routes as they are now: call it once every route is added.
    init(routes descriptions: [Router<Context>.RouteDescription]) {
        var byPath: [String: Route] = [:]
        var order: [String] = []
        for route in descriptions {
            let key = route.path.description
            if let known = byPath[key] {
                byPath[key] = Route(path: known.path, methods: known.methods + [route.method])
            } else {
                byPath[key] = Route(path: route.path, methods: [route.method])
                order.append(key)
            }
        }
        routes = order.compactMap { byPath[$0] }
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            let allowed = allowedMethods(for: request.uri.path)
            guard !allowed.isEmpty, !allowed.contains(request.method) else { throw error }
            let list = allowed.map(\.rawValue).joined(separator: ", ")
            throw Problem(.methodNotAllowed, detail: "This path takes \(list), not \(request.method.rawValue).", headers: [.allow: list])
        }
    }

    /// The methods the route the router would pick for `path` takes, in the order they were
    /// added; empty when no route matches. As in the router's trie, a constant part wins over a
    /// capture, and a capture over a wildcard, whatever the method: `DELETE
    /// /api/v1/history/changes` is not `DELETE /api/v1/history/:jobId`.
    func allowedMethods(for path: String) -> [HTTPRequest.Method] {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        var best: (rank: [Int], methods: [HTTPRequest.Method])?
        for route in routes where Self.matches(route.path.components, parts[...]) {
            let rank = route.path.components.map(Self.rank)
            if let current = best, current.rank == rank {
                best?.methods += route.methods.filter { !current.methods.contains($0) }
            } else if best.map({ $0.rank.lexicographicallyPrecedes(rank) }) ?? true {
                best = (rank, route.methods)
            }
        }
        return best?.methods ?? []
    }

    /// How specific an element is: a constant, then a capture or a partial match, then `*`,
    /// then `**`.
    private static func rank(_ element: RouterPath.Element) -> Int {
        if element == RouterPath.Element.recursiveWildcard { return 0 }
        if element == RouterPath.Element.wildcard { return 1 }
        return element == RouterPath.Element.path(Substring(element.description)) ? 3 : 2
    }

    /// Whether the path's parts match a route's elements, as the router's trie matches them: one
    /// part for each element, except `**`, which takes the rest.
    private static func matches(_ elements: [RouterPath.Element], _ parts: ArraySlice<Substring>) -> Bool {
        guard let element = elements.first else { return parts.isEmpty }
        if element == RouterPath.Element.recursiveWildcard { return true }
        guard let part = parts.first, element ~= part else { return false }
        return matches(Array(elements.dropFirst()), parts.dropFirst())
    }
}
