/// Who is calling: a signed-in user (JWT `sub`) or a guest known by device id.
public struct Caller: Sendable, Equatable {
    /// The user id every service keys on: the JWT's `sub`, or `device:<uuid>` for a guest.
    public var id: String
    /// The `email` claim, when the token carries one.
    public var email: String?
    /// Whether the caller is a guest (no bearer token, an `X-Device-Id`).
    public var isGuest: Bool

    public init(id: String, email: String? = nil, isGuest: Bool = false) {
        self.id = id
        self.email = email
        self.isGuest = isGuest
    }
}
