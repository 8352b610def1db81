import Foundation

/// `POST /v1/sso/device` (no token): a sign-in through the company's identity provider begun
/// for `dredge login --sso` (#55), by the OAuth device authorization grant (RFC 8628). The
/// server asks the provider on the command's behalf; the person opens ``verificationURI`` in
/// any browser, signs in there and enters ``userCode``, while the command polls
/// `POST /v1/sso/device/token` with ``deviceCode`` every ``interval`` seconds.
public struct DeviceSignInStarted: Codable, Sendable, Equatable {
    /// What the person types at the provider (as the provider printed it).
    public var userCode: String
    /// Where they type it.
    public var verificationURI: String
    /// The same page with the code filled in, when the provider offers one.
    public var verificationURIComplete: String?
    /// What the command polls with: a secret between it, the server and the provider.
    public var deviceCode: String
    /// Seconds between polls, at least.
    public var interval: Int
    /// Seconds until the code lapses.
    public var expiresIn: Int

    public init(userCode: String, verificationURI: String, verificationURIComplete: String?, deviceCode: String, interval: Int, expiresIn: Int) {
        (self.userCode, self.verificationURI, self.verificationURIComplete) = (userCode, verificationURI, verificationURIComplete)
        (self.deviceCode, self.interval, self.expiresIn) = (deviceCode, interval, expiresIn)
    }
}

/// `POST /v1/sso/device/token`'s body.
public struct DeviceSignInPoll: Codable, Sendable, Equatable {
    public var deviceCode: String
    /// The command's current interval in seconds (5 when absent): a pending answer gives it
    /// back, or five seconds more when the provider asked to slow down.
    public var interval: Int?

    public init(deviceCode: String, interval: Int? = nil) {
        self.deviceCode = deviceCode
        self.interval = interval
    }

    /// A device code longer than this is refused unread.
    public static let maximumLength = 2048
}

/// `POST /v1/sso/device/token`'s answer (200): still waiting for the person, or signed in.
/// A person the provider denied, a code that lapsed, and one whose groups give no role in
/// Dredge are errors (403 `access_denied`, 410 `expired`, 403 `forbidden`).
public struct DeviceSignInAnswer: Codable, Sendable, Equatable {
    public enum Status: String, Codable, Sendable { case pending, signedIn = "signed_in" }

    public var status: Status
    /// While pending: seconds to wait before the next poll (raised when the provider asks the
    /// command to slow down).
    public var interval: Int?
    /// Once signed in: a short-lived admin token with the person's role and scope, shown once.
    public var token: String?
    /// Once signed in: who the token signs in (`sso:SUBJECT`), its role, scope and expiry.
    public var caller: CallerInfo?
    /// Once signed in: the person's e-mail address or user name at the provider.
    public var shown: String?

    public init(status: Status, interval: Int? = nil, token: String? = nil, caller: CallerInfo? = nil, shown: String? = nil) {
        (self.status, self.interval, self.token, self.caller, self.shown) = (status, interval, token, caller, shown)
    }
}
