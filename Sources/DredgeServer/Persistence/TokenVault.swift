import DredgeAdminAPI
import Foundation

/// The tokens the server accepts, as the rest of the server sees them: admin tokens for the
/// admin API, enrollment tokens for agents, by kind and name.
///
/// The rules every implementation keeps (``TokenVaultConformanceTests`` checks each):
/// - Only a token's SHA-256 is kept; the token is returned once, by ``create(name:kind:now:)``.
/// - A name is 1 to 64 letters, digits, `-`, `_` or `.`, not one the audit log reserves
///   (``TokenError/reservedNames``), and unique within its kind (``TokenError/invalidName(_:)``,
///   ``TokenError/exists(_:)``).
/// - A revoked token is refused at once. The last admin token with the role admin and no
///   expiry cannot be revoked (``TokenError/lastAdmin``): nobody could make another.
/// - A token is accepted only as the kind it was made for, and not from its expiry on; an admin
///   token with the role and scope it was made with (``Caller``), admin for tokens made before roles.
/// - An enrollment token with an expiry is refused from then on; one with a number of uses is
///   refused once they are used (``useEnrollment(_:now:)`` takes one, atomically: two nodes
///   cannot both take the last), and a use given back (``returnEnrollmentUse(_:)``) counts again.
public protocol TokenVault: Sendable {
    /// Who the admin token `token` signs in (its name, role, scope and expiry), or nil when it
    /// is not one or has expired at `now`.
    func admin(for token: String, now: Date) async throws -> Caller?
    /// Whether `token` is an enrollment token that would be accepted at `now` (nothing used).
    func acceptsEnrollment(_ token: String, now: Date) async throws -> Bool
    /// Takes one use of the enrollment token `token` (if it counts them), or says why not.
    func useEnrollment(_ token: String, now: Date) async throws -> EnrollmentTokenUse
    /// Gives back a use of `token` taken for an enrollment that then failed (a key enrolled
    /// already, say); nothing if that token is gone or does not count uses.
    func returnEnrollmentUse(_ token: String) async throws
    /// By kind, then name.
    func list() async throws -> [TokenInfo]
    /// Makes a token with `limits` (``TokenRequest/limitsProblem``);
    /// the secret is in the result, and only its hash is kept.
    func create(name: String, kind: TokenKind, limits: TokenLimits, now: Date) async throws -> TokenCreated
    func revoke(name: String, kind: TokenKind) async throws

    // The web console's sessions (``ConsoleSessions``), kept with the tokens they were opened
    // with, so that a restart, or another node of a cluster, keeps them, and revoking a token
    // ends them in the same transaction.

    /// Keeps a session; first forgets the expired ones and, with `capacity` kept, the ones
    /// that expire first.
    func openSession(_ session: StoredConsoleSession, capacity: Int, now: Date) async throws
    /// The session kept under `key` if it has not expired at `now` and the admin token it was
    /// opened with is still there; otherwise nil, and the session is forgotten.
    func session(key: String, now: Date) async throws -> StoredConsoleSession?
    func closeSession(key: String) async throws
}

/// A token's limits, as kept: when it expires; an enrollment token's uses left; an admin
/// token's role and scope (#55).
public struct TokenLimits: Sendable, Equatable {
    public var expiresAt: Date?
    public var uses: Int?
    public var role: AdminRole
    public var scope: AccessScope
    /// Made by single sign-on for a person (`dredge login --sso`): named
    /// `sso:SUBJECT~LOGIN` (``TokenLimits/signedOnName(subject:)``), which no other token can
    /// be, and it must expire. It signs in as `sso:SUBJECT`, the name the console gives the
    /// same person (``Caller/person(ofToken:)``).
    public var signedOn: Bool

    public init(expiresAt: Date? = nil, uses: Int? = nil, role: AdminRole = .admin, scope: AccessScope = .everything, signedOn: Bool = false) {
        self.expiresAt = expiresAt.map { Date(timeIntervalSince1970: $0.timeIntervalSince1970.rounded(.down)) }
        self.uses = uses
        self.role = role
        self.scope = scope
        self.signedOn = signedOn
    }

    /// A new signed-on token's name: `sso:`, the person's subject percent-encoded (all but
    /// letters, digits and `-._@|+=:`, so it holds no `~` and no `/`), and a random login id
    /// after a `~` (``Caller/person(ofToken:)`` reads the person back).
    public static func signedOnName(subject: String) -> String {
        let kept = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._@|+=:")
        let encoded = subject.addingPercentEncoding(withAllowedCharacters: kept) ?? subject
        return SingleSignOn.namePrefix + encoded + "~" + (0..<4).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
    }

    /// The signed-on tokens that have expired at `now`, as a `WHERE` clause both back ends
    /// run: each login makes one, and they are deleted when the next is made.
    static func expiredSignedOnSQL(now: Date) -> String {
        "kind = 'admin' AND name LIKE '\(SingleSignOn.namePrefix)%' AND expires_at IS NOT NULL AND expires_at <= \(now.timeIntervalSince1970.rounded(.down))"
    }

    /// A kept role column read back.
    static func role(_ text: String, token name: String) throws -> AdminRole {
        guard let role = AdminRole(rawValue: text) else { throw DeploymentError("the stored role of admin token \(name) is unreadable: \(text)") }
        return role
    }
}

extension AccessScope {
    /// The scope as a column keeps it (a token's, a scoped pull's, a signed-on session's):
    /// JSON with its keys sorted, so the same scope is the same text; NULL for every device.
    var storedJSON: String? {
        get throws {
            guard !isEverything else { return nil }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            return String(decoding: try encoder.encode(self), as: UTF8.self)
        }
    }

    /// A kept scope column read back (nil for NULL). One that does not read is an error naming
    /// `owner` (`admin token alice`, `pull ID`), never a wider scope.
    static func stored(_ text: String?, of owner: String) throws -> AccessScope? {
        guard let text else { return nil }
        do {
            return try JSONDecoder().decode(AccessScope.self, from: Data(text.utf8))
        } catch {
            throw DeploymentError("the stored scope of \(owner) is unreadable: \(error)")
        }
    }
}

/// What offering an enrollment token came to.
public enum EnrollmentTokenUse: Sendable, Equatable {
    /// Accepted; one use taken if it counts them.
    case accepted(name: String)
    /// No enrollment token is that.
    case unknown
    case expired(name: String)
    case usedUp(name: String)

    /// Decides from what the vault holds for the token (its name, expiry and uses left).
    static func decide(_ row: (name: String, expiresAt: Double?, usesLeft: Int?)?, now: Date) -> EnrollmentTokenUse {
        guard let row else { return .unknown }
        if let expiresAt = row.expiresAt, expiresAt <= now.timeIntervalSince1970 { return .expired(name: row.name) }
        if let usesLeft = row.usesLeft, usesLeft <= 0 { return .usedUp(name: row.name) }
        return .accepted(name: row.name)
    }
}

extension TokenVault {
    public func acceptsEnrollment(_ token: String) async throws -> Bool { try await acceptsEnrollment(token, now: Date()) }

    public func create(name: String, kind: TokenKind, now: Date) async throws -> TokenCreated {
        try await create(name: name, kind: kind, limits: TokenLimits(), now: now)
    }

    /// How every implementation's ``session(key:now:)`` ends, given what its lookup found (the
    /// session, and whether the admin token it was opened with is still there): the session if
    /// it lives at `now` (and its token has not expired); otherwise nil, once an ended session is forgotten.
    func live(_ found: (session: StoredConsoleSession, tokenLives: Bool)?, at now: Date) async throws -> StoredConsoleSession? {
        guard let (session, tokenLives) = found else { return nil }
        guard tokenLives, let caller = session.caller, session.expires > now, (caller.expiresAt.map { $0 > now } ?? true) else {
            try await closeSession(key: session.key)
            return nil
        }
        return session
    }
}

/// A web console session as the database keeps it: nothing that signs anyone in. The cookie's
/// id is kept as its SHA-256 only, and the token as its SHA-256, as the token table keeps it.
/// Read back, it carries its token's role, scope and expiry (``caller``), read with it.
public struct StoredConsoleSession: Sendable, Equatable {
    /// Lowercase hex SHA-256 of the session cookie's id.
    public var key: String
    /// A person signed in through the identity provider (``isSignedOn``) has no token: the
    /// token's hash is empty, and their role and scope (``caller``) are kept with the session.
    /// The admin token's name and hash: the session lives while that token does.
    public var tokenName: String
    public var tokenSHA256: String
    /// Seconds since 1970, whole milliseconds (what both back ends keep exactly).
    public var expires: Date

    /// Who the session signs in, as its token says (not kept with the session: read from the
    /// token on every lookup); nil when its token is gone, and such a session is no session.
    public var caller: Caller?

    public init(key: String, tokenName: String, tokenSHA256: String, expires: Date, caller: Caller?) {
        self.key = key
        self.caller = caller
        self.tokenName = tokenName
        self.tokenSHA256 = tokenSHA256
        self.expires = Date(timeIntervalSince1970: (expires.timeIntervalSince1970 * 1_000).rounded(.down) / 1_000)
    }
}

/// A token about to be kept, the same for every implementation: its name checked, the secret
/// made, and only the secret's SHA-256 to store; ``created`` is what ``TokenVault/create(name:kind:now:)``
/// returns, the one time the secret is shown.
struct NewToken: Sendable {
    let kind: TokenKind
    let name: String
    /// Lowercase hex SHA-256 of the token.
    let sha256: String
    /// Seconds since 1970.
    let createdAt: Double
    let limits: TokenLimits
    let created: TokenCreated

    init(name: String, kind: TokenKind, limits: TokenLimits = TokenLimits(), now: Date) throws {
        if kind == .admin, limits.uses != nil { throw TokenError.limits("only enrollment tokens have a number of uses") }
        if kind == .enrollment, limits.role != .admin || !limits.scope.isEverything { throw TokenError.limits("only admin tokens have a role or a scope") }
        if limits.role == .admin, !limits.scope.isEverything { throw TokenError.limits("an admin has no scope") }
        if let problem = limits.scope.problem { throw TokenError.limits(problem) }
        if let uses = limits.uses, !TokenRequest.usesRange.contains(uses) { throw TokenError.limits("uses must be 1 to 1,000,000") }
        self.limits = limits
        if limits.signedOn {
            // The server's own name for a person's login (``TokenLimits/signedOnName(subject:)``).
            guard kind == .admin, limits.expiresAt != nil else { throw TokenError.limits("a token made by single sign-on is an admin token that expires") }
            guard name.hasPrefix(SingleSignOn.namePrefix), name.contains("~"), name.utf8.count <= 1024,
                !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
            else { throw TokenError.invalidName(name) }
        } else {
            guard !name.isEmpty, name.count <= 64, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }),
                !TokenError.reservedNames.contains(name)
            else {
                throw TokenError.invalidName(name)
            }
        }
        let token = TokenFile.generate(kind)
        self.kind = kind
        self.name = name
        sha256 = TokenFile.hash(token)
        createdAt = now.timeIntervalSince1970
        created = TokenCreated(
            info: TokenInfo(
                name: name, kind: kind, createdAt: Date(timeIntervalSince1970: createdAt), expiresAt: limits.expiresAt, usesLeft: limits.uses, role: limits.role,
                scope: limits.scope),
            token: token)
    }
}

extension StoredConsoleSession {
    /// A session of a person signed in through the identity provider: no token behind it.
    public var isSignedOn: Bool { tokenSHA256.isEmpty }

    /// What a session row keeps of its caller: a signed-on person's role and scope (a token's
    /// are read from the token).
    var keptAccess: (role: String?, scope: String?) {
        get throws {
            guard isSignedOn, let caller else { return (nil, nil) }
            return (caller.role.rawValue, try caller.scope.storedJSON)
        }
    }

    /// The caller of a session row read back: a signed-on person's from the row, a token's
    /// from the token (`token`: its role, scope and expiry, nil when the token is gone).
    static func caller(name: String, tokenSHA256: String, kept: (role: String?, scope: String?), token: (role: String?, scope: String?, expiresAt: Double?)?) throws -> Caller? {
        if tokenSHA256.isEmpty {
            guard let role = kept.role else { return nil }
            return try Caller.stored(name: name, role: role, scope: kept.scope, expiresAt: nil, now: nil)
        }
        guard let token else { return nil }
        return try Caller.stored(name: name, role: token.role, scope: token.scope, expiresAt: token.expiresAt, now: nil)
    }
}
