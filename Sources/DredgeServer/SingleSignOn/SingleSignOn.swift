import AsyncHTTPClient
import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import Foundation
import JWTKit
import NIOCore
import Synchronization

/// `sso` in `server.json`: the company's OpenID Connect identity provider the console signs
/// people in with (#55), and `dredge login --sso` too, and how their groups become a role and
/// a scope.
public struct SingleSignOnSettings: Codable, Sendable, Equatable {
    /// The provider's issuer URL (its discovery document is `ISSUER/.well-known/openid-configuration`).
    public var issuer: String?
    /// The console's client at the provider, and the file that holds its secret (relative to
    /// the data directory; the secret is never in `server.json`).
    public var clientID: String?
    public var clientSecretFile: String?
    /// The console's callback as browsers reach it (`https://HOST:PORT/console/sso/callback`),
    /// registered at the provider.
    public var redirectURL: String?
    /// The scopes asked for; `openid profile email` when absent.
    public var scopes: [String]?
    /// The ID token's claim that lists the person's groups; `groups` when absent.
    public var groupsClaim: String?
    /// Groups that make a person a reader, an investigator, an admin (the highest wins).
    public var readers: [String]?
    public var investigators: [String]?
    public var admins: [String]?
    /// Claims that scope a reader or investigator: a list of apps (`oven-control@>=2.1`), a
    /// list of labels (`region=eu`). Absent: unscoped.
    public var appsClaim: String?
    public var labelsClaim: String?
    /// The command line's client at the provider, public, allowed the device authorization
    /// grant (`dredge login --sso`). Absent: that command is refused.
    public var cliClientID: String?
    /// The provider's device authorization endpoint, when its discovery document does not name
    /// one (`device_authorization_endpoint`).
    public var deviceAuthorizationURL: String?
    /// How long a token `dredge login --sso` gets lasts, in hours (10 when absent; 1 to 168).
    public var cliTokenHours: Double?

    public init(
        issuer: String? = nil, clientID: String? = nil, clientSecretFile: String? = nil, redirectURL: String? = nil, scopes: [String]? = nil,
        groupsClaim: String? = nil, readers: [String]? = nil, investigators: [String]? = nil, admins: [String]? = nil, appsClaim: String? = nil,
        labelsClaim: String? = nil, cliClientID: String? = nil, deviceAuthorizationURL: String? = nil, cliTokenHours: Double? = nil
    ) {
        (self.issuer, self.clientID, self.clientSecretFile, self.redirectURL, self.scopes) = (issuer, clientID, clientSecretFile, redirectURL, scopes)
        (self.groupsClaim, self.readers, self.investigators, self.admins, self.appsClaim, self.labelsClaim) = (groupsClaim, readers, investigators, admins, appsClaim, labelsClaim)
        (self.cliClientID, self.deviceAuthorizationURL, self.cliTokenHours) = (cliClientID, deviceAuthorizationURL, cliTokenHours)
    }

    /// A command line token's lifetime in seconds.
    public var cliTokenSeconds: TimeInterval { (cliTokenHours ?? 10) * 3600 }

    public var isConfigured: Bool { issuer != nil }
}

/// Who the identity provider says signed in: from a verified ID token.
public struct SignedInPerson: Sendable, Equatable {
    public var subject: String
    /// What the console and the audit log call them: `sso:` and their subject, which the
    /// provider keeps for them (an e-mail address or a user name can change hands, or be set
    /// by the person, and the two-person rule of approvals compares names). Token names cannot
    /// hold a `:`, so no person is mistaken for a token.
    public var name: String
    /// Their e-mail address or user name as the token says, for people to read (audit details).
    public var shown: String
    public var groups: [String]
    /// The scope claims' lists; nil when the claim is configured but absent or not a list of
    /// strings (a reader or investigator is then refused, never unscoped).
    public var apps: [String]?
    public var labels: [String]?
}

/// The console's OpenID Connect sign-in (authorization code with PKCE, `S256`): the URL a
/// browser is sent to, and the person the code it comes back with stands for, from an ID token
/// checked against the provider's published keys (signature, issuer, audience, expiry, the
/// nonce this sign-in chose). The provider's discovery document and keys are fetched when first
/// needed and kept; the keys are fetched again when a token names one not held (at most once a
/// minute). What the browser must hold between leaving and coming back (the state, the nonce,
/// the PKCE verifier) is a cookie of its own, so any node of a cluster can finish a sign-in.
public final class SingleSignOn: Sendable {
    public let settings: SingleSignOnSettings
    let issuer: String
    let clientID: String
    let clientSecret: String
    let redirectURL: String
    let now: @Sendable () -> Date
    /// A client of its own that follows no redirect (a code and its verifier go to the token
    /// endpoint and nowhere else), kept for the process's life like AsyncHTTPClient's shared one.
    private static let client = HTTPClient(
        eventLoopGroupProvider: .singleton, configuration: HTTPClient.Configuration(redirectConfiguration: .disallow, timeout: .init(connect: .seconds(5), read: .seconds(10))))
    var http: HTTPClient { Self.client }
    /// How often one address may start and poll `dredge login --sso` (``DeviceSignInThrottle``).
    let deviceThrottle = DeviceSignInThrottle()
    private let cache = Mutex<(discovery: Discovery?, keys: JWTKeyCollection?, kids: Set<String>, keysFetched: Date?)>((nil, nil, [], nil))

    /// The provider's endpoints, from its discovery document.
    struct Discovery: Codable, Sendable {
        var issuer: String
        var authorization_endpoint: String
        var token_endpoint: String
        var jwks_uri: String
        var end_session_endpoint: String?
        var userinfo_endpoint: String?
        var device_authorization_endpoint: String?
    }

    /// What the browser keeps between leaving for the provider and coming back.
    struct Pending: Codable, Sendable {
        var state: String
        var nonce: String
        var verifier: String
        var returnTo: String?
        /// Seconds since 1970: a sign-in has ten minutes.
        var started: Double
    }

    public static let cookie = "dredge_console_sso"
    /// What every signed-on person's name starts with (token names cannot hold a `:`).
    public static let namePrefix = "sso:"
    static let pendingSeconds: Double = 600

    /// Reads the client secret from `settings.clientSecretFile` (relative to `directory`).
    public init(settings: SingleSignOnSettings, directory: String, now: @escaping @Sendable () -> Date = { Date() }) throws {
        guard let issuer = settings.issuer, let clientID = settings.clientID, let redirectURL = settings.redirectURL, let secretFile = settings.clientSecretFile else {
            throw DeploymentError("sso needs issuer, clientID, clientSecretFile and redirectURL")
        }
        guard URL(string: issuer)?.host != nil else { throw DeploymentError("sso.issuer is not a URL: \(issuer)") }
        guard Self.isProviderURL(issuer) else { throw DeploymentError("sso.issuer must be https:// (plain http only on loopback): \(issuer)") }
        let path = secretFile.hasPrefix("/") ? secretFile : directory + "/" + secretFile
        guard let secret = FileManager.default.contents(atPath: path).map({ String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) }), !secret.isEmpty
        else { throw DeploymentError("sso.clientSecretFile: cannot read the client secret from \(path)") }
        self.settings = settings
        self.issuer = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        self.clientID = clientID
        self.clientSecret = secret
        self.redirectURL = redirectURL
        self.now = now
        if let hours = settings.cliTokenHours, !(1...168).contains(hours) { throw DeploymentError("sso.cliTokenHours must be 1 to 168 (a week): \(hours)") }
        for (key, value) in [("sso.deviceAuthorizationURL", settings.deviceAuthorizationURL)] {
            if let value, !Self.isProviderURL(value) { throw DeploymentError("\(key) must be an https:// URL (plain http only on loopback): \(value)") }
        }
    }

    /// An https URL, or an http one on loopback (a provider for tests and trials).
    static func isProviderURL(_ text: String) -> Bool {
        guard let url = URL(string: text), let scheme = url.scheme, let host = url.host else { return false }
        return scheme == "https" || scheme == "http" && ["127.0.0.1", "::1", "localhost"].contains(host)
    }

    // MARK: Leaving for the provider

    /// The provider's authorization URL for a new sign-in, and the cookie value that must come
    /// back with it.
    func start(returnTo: String?) async throws -> (url: String, cookie: String) {
        let discovery = try await discovered()
        let pending = Pending(
            state: ConsoleSessions.randomToken(), nonce: ConsoleSessions.randomToken(), verifier: ConsoleSessions.randomToken() + ConsoleSessions.randomToken(),
            returnTo: returnTo, started: now().timeIntervalSince1970)
        let challenge = Self.base64URL(Array(SHA256.hash(data: Array(pending.verifier.utf8))))
        guard var components = URLComponents(string: discovery.authorization_endpoint) else { throw SingleSignOnError("the provider's authorization endpoint is not a URL") }
        let asked = components.queryItems ?? []
        components.queryItems = asked + [
            URLQueryItem(name: "response_type", value: "code"), URLQueryItem(name: "client_id", value: clientID),
            URLQueryItem(name: "redirect_uri", value: redirectURL), URLQueryItem(name: "scope", value: (settings.scopes ?? ["openid", "profile", "email"]).joined(separator: " ")),
            URLQueryItem(name: "state", value: pending.state), URLQueryItem(name: "nonce", value: pending.nonce),
            URLQueryItem(name: "code_challenge", value: challenge), URLQueryItem(name: "code_challenge_method", value: "S256"),
        ]
        guard let url = components.url?.absoluteString else { throw SingleSignOnError("the provider's authorization endpoint is not a URL") }
        let payload = Self.base64URL(Array(try JSONEncoder().encode(pending)))
        return (url, payload + "." + Self.base64URL(Array(HMAC<SHA256>.authenticationCode(for: Array(payload.utf8), using: cookieKey))))
    }

    /// What the sign-in cookie is signed with: derived from the client secret, which every node
    /// of a cluster holds, so none can be forged (or its start moved) by the browser.
    private var cookieKey: SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: Array(clientSecret.utf8)), info: Array("dredge console sso cookie".utf8), outputByteCount: 32)
    }

    /// The sign-in cookie's content, once its signature holds.
    private func pending(_ cookie: String?) -> Pending? {
        guard let cookie, cookie.utf8.count <= 4096 else { return nil }
        let parts = cookie.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let mac = Self.fromBase64URL(String(parts[1])),
            HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: Array(parts[0].utf8), using: cookieKey),
            let data = Self.fromBase64URL(String(parts[0]))
        else { return nil }
        return try? JSONDecoder().decode(Pending.self, from: Data(data))
    }

    // MARK: Coming back

    /// The person a callback stands for: its `state` checked against the cookie's, its code
    /// exchanged at the provider (with the PKCE verifier), the ID token verified.
    func finish(code: String, state: String, cookie: String?) async throws -> (person: SignedInPerson, returnTo: String?) {
        guard let pending = pending(cookie) else {
            throw SingleSignOnError("this sign-in was not started from this browser (or its cookie is gone): start again")
        }
        guard ConsoleSessions.same(pending.state, state) else { throw SingleSignOnError("the provider's answer is not for this browser's sign-in: start again") }
        guard now().timeIntervalSince1970 - pending.started < Self.pendingSeconds else { throw SingleSignOnError("the sign-in took more than ten minutes: start again") }
        let discovery = try await discovered()
        let form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURL), ("code_verifier", pending.verifier)]
        let (status, body) = try await postForm(discovery.token_endpoint, form, basic: (clientID, clientSecret))
        guard status == 200 else {
            throw SingleSignOnError("the provider refused the sign-in's code (\(status)): \(String(buffer: body).prefix(200))")
        }
        struct Tokens: Decodable { var id_token: String? }
        guard let idToken = (try? JSONDecoder().decode(Tokens.self, from: Data(buffer: body)))?.id_token else {
            throw SingleSignOnError("the provider answered without an ID token (is `openid` among sso.scopes?)")
        }
        return (try await person(idToken: idToken, nonce: pending.nonce), pending.returnTo)
    }

    /// The person an ID token names, once it is verified: signed by one of the provider's
    /// keys, issued by it, for `audience` (the console's client unless said), not expired (a
    /// minute's leeway), with `nonce` (the console's sign-ins; the device grant has none).
    func person(idToken: String, nonce: String?, audience: String? = nil) async throws -> SignedInPerson {
        // A key id the provider's keys as held do not have: it rotated them since; fetch them
        // again (at most once a minute) rather than let another key be tried.
        struct Header: Decodable { var kid: String? }
        let header = idToken.split(separator: ".").first.flatMap { Self.fromBase64URL(String($0)) }.flatMap { try? JSONDecoder().decode(Header.self, from: Data($0)) }
        let held = cache.withLock { $0.kids }
        let claims: IDTokenClaims
        do {
            claims = try await providerKeys(refresh: header?.kid.map { !held.contains($0) } ?? false).verify(idToken, as: IDTokenClaims.self)
        } catch let error as SingleSignOnError {
            throw error
        } catch {
            throw SingleSignOnError("the ID token does not verify: \(error)")
        }
        return try check(claims, nonce: nonce, audience: audience ?? clientID)
    }

    /// The claims' issuer, audience, expiry and nonce (the signature is checked already).
    func check(_ claims: IDTokenClaims, nonce: String?, audience: String) throws -> SignedInPerson {
        guard claims.iss.value == issuer || claims.iss.value == issuer + "/" else { throw SingleSignOnError("the ID token is from another issuer: \(claims.iss.value)") }
        guard claims.aud.value.contains(audience) else { throw SingleSignOnError("the ID token is not for \(audience) (its audience is \(claims.aud.value))") }
        guard claims.exp.value.addingTimeInterval(60) > now() else { throw SingleSignOnError("the ID token has expired") }
        if let nonce {
            guard let sent = claims.nonce, ConsoleSessions.same(sent, nonce) else { throw SingleSignOnError("the ID token is not for this sign-in (its nonce differs)") }
        }
        return try person(claims.others, from: "the ID token")
    }

    /// The person a set of claims names (an ID token's, or the userinfo endpoint's): their
    /// subject, what to show, their groups and scope claims as the settings name them.
    func person(_ claims: [String: IDTokenClaims.JSONValue], from source: String) throws -> SignedInPerson {
        func string(_ name: String) -> String? { if case .string(let s)? = claims[name] { s } else { nil } }
        func strings(_ name: String) -> [String]? { IDTokenClaims.strings(claims[name]) }
        guard let subject = string("sub"), !subject.isEmpty, subject.utf8.count <= 255, !subject.unicodeScalars.contains(where: Self.isHidden)
        else {
            throw SingleSignOnError("\(source)'s subject is absent, empty, too long or holds a control character")
        }
        let shown = (string("email") ?? string("preferred_username") ?? subject).unicodeScalars.filter { !Self.isHidden($0) }.map(String.init).joined()
        return SignedInPerson(
            subject: subject, name: Self.namePrefix + subject, shown: String(shown.prefix(120)), groups: strings(settings.groupsClaim ?? "groups") ?? [],
            apps: settings.appsClaim.map { strings($0) } ?? [], labels: settings.labelsClaim.map { strings($0) } ?? [])
    }

    /// The role and scope a person's groups give (``SingleSignOnSettings``): nil when none of
    /// their groups is one of Dredge's, or, for a reader or investigator, when a configured
    /// scope claim is absent, empty or does not read (never unscoped for want of a claim).
    public func caller(for person: SignedInPerson, until expiry: Date) -> Caller? {
        let groups = Set(person.groups)
        func any(_ names: [String]?) -> Bool { !(names ?? []).filter(groups.contains).isEmpty }
        let role: AdminRole
        if any(settings.admins) { role = .admin } else if any(settings.investigators) { role = .investigator } else if any(settings.readers) { role = .reader } else { return nil }
        if role == .admin { return Caller(name: person.name, role: role, expiresAt: expiry) }
        guard let apps = person.apps, let labels = person.labels else { return nil }
        if settings.appsClaim != nil && apps.isEmpty || settings.labelsClaim != nil && labels.isEmpty { return nil }
        // Claims that do not make a scope refuse the person (never a wider scope).
        guard let scope = try? AccessScope(apps: apps, labels: labels) else { return nil }
        return Caller(name: person.name, role: role, scope: scope, expiresAt: expiry)
    }

    /// Where the browser goes to end its session at the provider too (RP-initiated logout),
    /// when the provider has such an endpoint.
    func endSessionURL() async -> String? {
        guard let endpoint = try? await discovered().end_session_endpoint, var components = URLComponents(string: endpoint) else { return nil }
        let asked = components.queryItems ?? []
        let back = redirectURL.hasSuffix("/sso/callback") ? String(redirectURL.dropLast("/sso/callback".count)) + "/sign-in" : nil
        components.queryItems = asked + [URLQueryItem(name: "client_id", value: clientID)] + (back.map { [URLQueryItem(name: "post_logout_redirect_uri", value: $0)] } ?? [])
        return components.url?.absoluteString
    }

    // MARK: The provider's documents

    /// Posts a form to the provider (with the client's credentials when `basic` is given, as
    /// HTTP Basic), and its answer: at most 1 MiB, within 15 s.
    func postForm(_ url: String, _ form: [(String, String)], basic: (id: String, secret: String)? = nil) async throws -> (Int, ByteBuffer) {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        request.headers.add(name: "Accept", value: "application/json")
        if let basic {
            let credentials = Data("\(Console.percentEncoded(basic.id)):\(Console.percentEncoded(basic.secret))".utf8).base64EncodedString()
            request.headers.add(name: "Authorization", value: "Basic \(credentials)")
        }
        request.body = .bytes(ByteBuffer(string: form.map { "\($0.0)=\(Console.percentEncoded($0.1))" }.joined(separator: "&")))
        do {
            let response = try await http.execute(request, timeout: .seconds(15))
            return (Int(response.status.code), try await response.body.collect(upTo: 1 << 20))
        } catch {
            throw SingleSignOnError("cannot reach the identity provider at \(url): \(error)")
        }
    }

    func discovered() async throws -> Discovery {
        if let known = cache.withLock({ $0.discovery }) { return known }
        let discovery: Discovery = try await fetch(issuer + "/.well-known/openid-configuration")
        guard discovery.issuer == issuer || discovery.issuer == issuer + "/" else {
            throw SingleSignOnError("the provider's discovery document names another issuer (\(discovery.issuer)): check sso.issuer")
        }
        cache.withLock { $0.discovery = discovery }
        return discovery
    }

    private func providerKeys(refresh: Bool) async throws -> JWTKeyCollection {
        let current = cache.withLock { $0 }
        let age = current.keysFetched.map { now().timeIntervalSince($0) } ?? .infinity
        // Kept an hour; fetched again sooner only when asked, and not twice in a minute.
        if let keys = current.keys, age < 3600, !refresh || age < 60 { return keys }
        let discovery = try await discovered()
        let jwks: JWKS = try await fetch(discovery.jwks_uri)
        let keys = JWTKeyCollection()
        do {
            try await keys.add(jwks: jwks)
        } catch {
            throw SingleSignOnError("the provider's keys do not read: \(error)")
        }
        let kids = Set(jwks.keys.compactMap { $0.keyIdentifier?.string })
        cache.withLock { ($0.keys, $0.kids, $0.keysFetched) = (keys, kids, now()) }
        return keys
    }

    func fetch<T: Decodable>(_ url: String, bearer: String? = nil) async throws -> T {
        let response: HTTPClientResponse
        let body: ByteBuffer
        do {
            var request = HTTPClientRequest(url: url)
            request.headers.add(name: "Accept", value: "application/json")
            if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
            response = try await http.execute(request, timeout: .seconds(15))
            body = try await response.body.collect(upTo: 1 << 20)
        } catch {
            throw SingleSignOnError("cannot reach the identity provider at \(url): \(error)")
        }
        guard response.status == .ok else { throw SingleSignOnError("the identity provider answered \(response.status.code) for \(url)") }
        do {
            return try JSONDecoder().decode(T.self, from: Data(buffer: body))
        } catch {
            throw SingleSignOnError("the identity provider's \(url) does not read: \(error)")
        }
    }

    /// A character that is not what it shows in a terminal or a log: C0 and C1 controls, DEL,
    /// and the invisible and direction-changing formatting characters (Unicode's `Cf`).
    static func isHidden(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.properties.generalCategory == .format
    }

    // MARK: Encodings

    static func base64URL(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    static func fromBase64URL(_ text: String) -> [UInt8]? {
        guard text.utf8.count <= 4096 else { return nil }
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.utf8.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64).map(Array.init)
    }
}

/// Why a single sign-on did not sign anyone in, said to the person (and logged).
public struct SingleSignOnError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// The claims of an ID token: those checked by name, and every claim (the subject, the
/// e-mail address, the groups and scope claims the settings name) in ``others``.
struct IDTokenClaims: JWTPayload {
    var iss: IssuerClaim
    var sub: SubjectClaim
    var aud: AudienceClaim
    var exp: ExpirationClaim
    var nonce: String?
    /// Every claim, for those the settings name (`groups`, `dredge_apps`…).
    var others: [String: JSONValue]

    enum JSONValue: Codable, Sendable {
        case string(String), strings([String]), other

        init(from decoder: any Decoder) throws {
            let c = try decoder.singleValueContainer()
            if let s = try? c.decode(String.self) {
                self = .string(s)
            } else if let list = try? c.decode([String].self) {
                self = .strings(list)
            } else {
                self = .other
            }
        }

        func encode(to encoder: any Encoder) throws {
            var c = encoder.singleValueContainer()
            switch self {
            case .string(let s): try c.encode(s)
            case .strings(let list): try c.encode(list)
            case .other: try c.encodeNil()
            }
        }
    }

    struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        iss = try c.decode(IssuerClaim.self, forKey: Key(stringValue: "iss"))
        sub = try c.decode(SubjectClaim.self, forKey: Key(stringValue: "sub"))
        aud = try c.decode(AudienceClaim.self, forKey: Key(stringValue: "aud"))
        exp = try c.decode(ExpirationClaim.self, forKey: Key(stringValue: "exp"))
        nonce = try c.decodeIfPresent(String.self, forKey: Key(stringValue: "nonce"))
        var others: [String: JSONValue] = [:]
        for key in c.allKeys { others[key.stringValue] = try? c.decode(JSONValue.self, forKey: key) }
        self.others = others
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        for (name, value) in others { try c.encode(value, forKey: Key(stringValue: name)) }
    }

    /// The signature is checked by the key collection; the claims by ``SingleSignOn/check(_:nonce:)``.
    func verify(using algorithm: some JWTAlgorithm) async throws {}

    /// A claim as a list of strings: a list, or one string (some providers send a lone group
    /// so); nil when it is absent or anything else.
    func strings(_ name: String) -> [String]? { Self.strings(others[name]) }

    static func strings(_ value: JSONValue?) -> [String]? {
        switch value {
        case .string(let s)?: [s]
        case .strings(let list)?: list
        default: nil
        }
    }
}
