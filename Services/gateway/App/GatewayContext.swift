import Foundation
import Hummingbird
import NIOCore

/// What the gateway's routes know of a request beyond Hummingbird's own: the connection's peer
/// address, the caller once `AuthenticationMiddleware` has checked who it is, and the API's JSON
/// coders (camelCase, ISO 8601 dates) as the context's request decoder and response encoder.
public protocol GatewayRequestContext: RemoteAddressRequestContext where Decoder == JSONDecoder, Encoder == JSONEncoder {
    /// Who the request comes from; set by `AuthenticationMiddleware` for the routes behind it.
    var identity: Caller? { get set }
}

extension GatewayRequestContext {
    /// The caller `AuthenticationMiddleware` checked. A route outside its group has none: that is
    /// the gateway's mistake, not the client's (500).
    public func caller() throws -> Caller {
        guard let identity else { throw Problem(.internalServerError, detail: "This route was reached without its caller being checked.") }
        return identity
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
