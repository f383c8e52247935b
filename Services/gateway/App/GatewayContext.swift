import Foundation
import Hummingbird
import NIOCore

/// What the gateway's routes know of a request beyond Hummingbird's own: the connection's peer
/// address, the caller once `AuthenticationMiddleware` has checked who it is (routes behind it
/// read it from `AuthenticatedContext`), and the API's JSON
/// coders (camelCase, ISO 8601 dates) as the context's request decoder and response encoder.
public protocol GatewayRequestContext: RemoteAddressRequestContext where Decoder == JSONDecoder, Encoder == JSONEncoder {
    /// Who the request comes from; set by `AuthenticationMiddleware` for the routes behind it.
    var identity: Caller? { get set }
}

/// The context of a route behind `AuthenticationMiddleware` (`RouterMethods.authenticated(by:)`):
/// its caller is in the type. Made from the parent's context once the middleware has checked
/// who the request comes from; with no caller there (a group that skipped the middleware, the
/// gateway's mistake and never the client's) it is not made, and the request answers 500.
public struct AuthenticatedContext<Parent: GatewayRequestContext>: ChildRequestContext, GatewayRequestContext {
    public typealias ParentContext = Parent
    public var coreContext: CoreRequestContextStorage
    public let remoteAddress: SocketAddress?
    /// Who the request comes from.
    public private(set) var caller: Caller

    public init(context: Parent) throws {
        guard let caller = context.identity else {
            throw Problem(.internalServerError, detail: "This route was reached without its caller being checked.")
        }
        // The parent's core context: its logger and the route's parameters.
        coreContext = context.coreContext
        remoteAddress = context.remoteAddress
        self.caller = caller
    }

    /// The caller, as the parent's context holds it; setting a caller replaces it.
    public var identity: Caller? {
        get { caller }
        set { if let newValue { caller = newValue } }
    }

    public var requestDecoder: JSONDecoder { JSONBody.decoder }
    public var responseEncoder: JSONEncoder { JSONResponse.encoder }
}

extension RouterMethods where Context: GatewayRequestContext {
    /// A group whose routes run behind `AuthenticationMiddleware`, each with its caller in the
    /// type (`AuthenticatedContext`).
    func authenticated(by authenticator: Authenticator) -> RouterGroup<AuthenticatedContext<Context>> {
        group().add(middleware: AuthenticationMiddleware(authenticator: authenticator)).group(context: AuthenticatedContext<Context>.self)
    }
}

/// The gateway's request context.
public struct GatewayContext: GatewayRequestContext {
    public var coreContext: CoreRequestContextStorage
    public let remoteAddress: SocketAddress?
    public var identity: Caller?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
    }

    public var requestDecoder: JSONDecoder { JSONBody.decoder }
    public var responseEncoder: JSONEncoder { JSONResponse.encoder }
}
