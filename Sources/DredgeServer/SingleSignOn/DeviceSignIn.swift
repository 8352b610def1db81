import AsyncHTTPClient
import DredgeAdminAPI
import Foundation
import NIOCore
import Synchronization

/// `dredge login --sso` (#55): the OAuth device authorization grant (RFC 8628), with the server
/// as the provider's client on the command's behalf. The command never talks to the provider;
/// the server asks it for a code, and the command polls the server, which polls the provider's
/// token endpoint with the command's device code. What the provider answers there comes
/// straight to the server over its own connection, so its claims (the ID token's when the
/// provider sends one, verified as the console's are but for the command line's client;
/// else the userinfo endpoint's, read with the access token) are the person's. The person's
/// groups then give a role and scope as they do in the console, and the command gets a
/// short-lived admin token (``AdminActions/signedOnToken(for:shown:from:)``).
extension SingleSignOn {
    /// Where a poll stands.
    enum DevicePoll: Sendable, Equatable {
        /// The person has not answered yet: poll again in `interval` seconds.
        case pending(interval: Int)
        case signedIn(SignedInPerson)
    }

    /// Why a device sign-in ended without anyone signed in, for the command to say.
    enum DeviceRefusal: Error, Equatable {
        /// The server has no client for the command line (`sso.cliClientID`).
        case off
        /// The person denied the request at the provider.
        case denied
        /// The code lapsed before the person answered.
        case expired
        /// The provider knows no such device code (`invalid_grant`; django-oauth-toolkit says
        /// `device_not_found`): made up, or already used.
        case unknown
    }

    /// Asks the provider for a device code and the code the person will enter.
    func startDevice() async throws -> DeviceSignInStarted {
        guard let client = settings.cliClientID else { throw DeviceRefusal.off }
        let discovery = try await discovered()
        guard let endpoint = settings.deviceAuthorizationURL ?? discovery.device_authorization_endpoint else {
            throw SingleSignOnError("the identity provider names no device authorization endpoint in its discovery document: set sso.deviceAuthorizationURL")
        }
        let (status, body) = try await postForm(endpoint, [("client_id", client), ("scope", (settings.scopes ?? ["openid", "profile", "email"]).joined(separator: " "))])
        guard status == 200 else { throw SingleSignOnError("the identity provider refused to start a device sign-in (\(status), \(Self.errorCode(body) ?? "no error code"))") }
        struct Answer: Decodable {
            var device_code: String
            var user_code: String
            var verification_uri: String
            var verification_uri_complete: String?
            var expires_in: Int
            var interval: Int?
        }
        guard let answer = try? JSONDecoder().decode(Answer.self, from: Data(buffer: body)) else {
            throw SingleSignOnError("the identity provider's device authorization answer does not read")
        }
        func printable(_ text: String, _ limit: Int) -> Bool {
            !text.isEmpty && text.utf8.count <= limit && !text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
        }
        // What the command prints and a person opens: a web address, and codes that hold no control character.
        guard printable(answer.device_code, DeviceSignInPoll.maximumLength), printable(answer.user_code, 64), Self.isWebURL(answer.verification_uri),
            answer.verification_uri_complete.map(Self.isWebURL) ?? true, answer.expires_in > 0
        else { throw SingleSignOnError("the identity provider's device authorization answer is not one a person can use") }
        return DeviceSignInStarted(
            userCode: answer.user_code, verificationURI: answer.verification_uri, verificationURIComplete: answer.verification_uri_complete,
            deviceCode: answer.device_code, interval: min(60, max(1, answer.interval ?? 5)), expiresIn: min(answer.expires_in, 3600))
    }

    /// One poll of the provider's token endpoint for `deviceCode`; `interval` is the command's
    /// current one (raised by five seconds when the provider says to slow down, as RFC 8628 asks).
    func pollDevice(deviceCode: String, interval: Int) async throws -> DevicePoll {
        guard let client = settings.cliClientID else { throw DeviceRefusal.off }
        let discovery = try await discovered()
        let (status, body) = try await postForm(
            discovery.token_endpoint, [("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("device_code", deviceCode), ("client_id", client)])
        guard status == 200 else {
            switch Self.errorCode(body) {
            case "authorization_pending": return .pending(interval: interval)
            case "slow_down": return .pending(interval: min(60, interval + 5))
            case "access_denied": throw DeviceRefusal.denied
            case "expired_token": throw DeviceRefusal.expired
            case "invalid_grant", "device_not_found": throw DeviceRefusal.unknown
            case let code: throw SingleSignOnError("the identity provider refused the device code (\(status), \(code ?? "no error code"))")
            }
        }
        struct Tokens: Decodable {
            var id_token: String?
            var access_token: String?
        }
        guard let tokens = try? JSONDecoder().decode(Tokens.self, from: Data(buffer: body)) else { throw SingleSignOnError("the identity provider's token answer does not read") }
        if let idToken = tokens.id_token { return .signedIn(try await person(idToken: idToken, nonce: nil, audience: client)) }
        guard let access = tokens.access_token, let userinfo = discovery.userinfo_endpoint else {
            throw SingleSignOnError("the identity provider answered the device code with neither an ID token nor a userinfo endpoint to read the person from")
        }
        let claims: [String: IDTokenClaims.JSONValue] = try await fetch(userinfo, bearer: access)
        return .signedIn(try person(claims, from: "the identity provider's userinfo"))
    }

    /// An address a person's browser may be sent to.
    static func isWebURL(_ text: String) -> Bool {
        guard text.utf8.count <= 2048, let url = URL(string: text), let scheme = url.scheme, url.host != nil else { return false }
        return scheme == "https" || scheme == "http"
    }

    /// The `error` member of an OAuth error answer.
    static func errorCode(_ body: ByteBuffer) -> String? {
        struct OAuthError: Decodable { var error: String }
        guard let code = (try? JSONDecoder().decode(OAuthError.self, from: Data(buffer: body)))?.error,
            code.count <= 64, code.unicodeScalars.allSatisfy({ ("a"..."z").contains($0) || $0 == "_" })
        else { return nil }
        return code
    }
}

/// How often one address may start device sign-ins and poll them (each is a request to the
/// identity provider, asked by someone the server does not know yet): per address and minute
/// (an IPv6 address by its /64, which one host may hold whole), and for all addresses together.
/// Bounded: in a minute that has seen ``capacity`` addresses, new ones wait for the next.
final class DeviceSignInThrottle: Sendable {
    enum Kind: Sendable { case start, poll }

    static let startsPerAddress = 10
    static let pollsPerAddress = 120
    static let startsInAll = 300
    static let pollsInAll = 3000
    static let capacity = 10_000
    private struct Minute {
        var minute = 0
        var counts: [String: (starts: Int, polls: Int)] = [:]
        var starts = 0
        var polls = 0
    }
    private let state = Mutex(Minute())

    /// Whether `host` may make one more request of `kind` now (counted when it may).
    func admit(_ kind: Kind, host: String, now: Date) -> Bool {
        let address = Self.address(host)
        return state.withLock { state in
            let minute = Int(now.timeIntervalSince1970 / 60)
            if state.minute != minute { state = Minute(minute: minute) }
            guard state.counts[address] != nil || state.counts.count < Self.capacity else { return false }
            var count = state.counts[address] ?? (0, 0)
            switch kind {
            case .start:
                guard state.starts < Self.startsInAll, count.starts < Self.startsPerAddress else { return false }
                count.starts += 1
                state.starts += 1
            case .poll:
                guard state.polls < Self.pollsInAll, count.polls < Self.pollsPerAddress else { return false }
                count.polls += 1
                state.polls += 1
            }
            state.counts[address] = count
            return true
        }
    }

    /// What is counted as one address: an IPv4 address, an IPv6 address's first 64 bits.
    static func address(_ host: String) -> String {
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        guard bare.contains(":") else { return bare }
        var network = in6_addr()
        guard inet_pton(AF_INET6, bare, &network) == 1 else { return bare }
        return withUnsafeBytes(of: &network) { bytes in bytes.prefix(8).map { String(format: "%02x", $0) }.joined() } + "::/64"
    }
}
