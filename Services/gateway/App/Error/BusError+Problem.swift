import HTTPTypes
import Hummingbird
import Messages

extension Problem {
    /// The HTTP answer for a bus call that failed: the one place bus codes become statuses.
    public init(_ error: BusError, service: String) {
        let status: HTTPResponse.Status
        var headers: HTTPFields = [:]
        switch error.code {
        case .timeout: status = .gatewayTimeout
        case .unavailable, .overloaded, .connectionLost:
            status = .serviceUnavailable
            headers[.retryAfter] = "1"
        case .storageFull:
            status = .init(code: 507, reasonPhrase: "Insufficient Storage")
            headers[.retryAfter] = "30"
        case .storageUnavailable:
            status = .serviceUnavailable
            headers[.retryAfter] = "5"
        case .notFound: status = .notFound
        case .badRequest: status = .badRequest
        case .conflict: status = .conflict
        case .cancelled: status = .init(code: 499, reasonPhrase: "Client Closed Request")
        case .unknownMethod, .badReply: status = .badGateway
        case Quota.ErrorCode.unknownPlan, Quota.ErrorCode.unknownTimeZone: status = .unprocessableContent
        case Quota.ErrorCode.chargeSettled, Quota.ErrorCode.jobIdTaken, Jobs.ErrorCode.alreadyFinished, Jobs.ErrorCode.abandoned: status = .conflict
        case Jobs.ErrorCode.unknownEffect, Jobs.ErrorCode.invalidParameters: status = .unprocessableContent
        case History.ErrorCode.invalidCursor: status = .badRequest
        case History.ErrorCode.tokenExpired: status = .gone
        case History.ErrorCode.notShareable: status = .conflict
        case Jobs.ErrorCode.queueFull:
            status = .serviceUnavailable
            headers[.retryAfter] = "5"
        default: status = error.retryable ? .serviceUnavailable : .internalServerError
        }
        self.init(
            status,
            detail: error.message,
            headers: headers,
            extensions: ["service": .string(service), "code": .string(error.code.rawValue)]
        )
    }
}
