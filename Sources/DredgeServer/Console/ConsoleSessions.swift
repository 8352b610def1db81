import Crypto
import DredgeEnvelope
import Foundation

/// The web console's signed-in sessions, kept in the server's database with the tokens
/// (``TokenVault/openSession(_:capacity:now:)``): a restart keeps everyone signed in, and so
/// does any node of a cluster.
///
/// A session is made from an admin token and lives while that token does: every request
/// checks that the token is still there (and reads its role and scope), and revoking it ends
/// its sessions. A session also
/// ends when it is signed out, at its expiry (absolute, from sign-in), or when the server
/// holds too many (the ones expiring first go). Ids are 256 random bits; the database keeps
/// only their SHA-256 (and the token's), so a copy of it signs nobody in, and a lookup's
/// timing says nothing about the ids it holds. The CSRF token every form carries is derived
/// from the id (an HMAC under it): nothing that could forge a form is stored either.
public final class ConsoleSessions: Sendable {
    public struct Session: Sendable, Equatable {
        /// Who signed in, as the token says now: its name (what the audit log records the
        /// console's actions under), role and scope.
        public var caller: Caller
        public var tokenName: String { caller.name }
        /// What every form of this session carries.
        public var csrf: String
        public var expires: Date
        /// A person the identity provider signed in (``open(signedOn:)``), no token behind
        /// the session; false for one opened with a token, even one `dredge login --sso` made.
        public var signedOn = false
    }

    public static let defaultLifetime: TimeInterval = 8 * 3600
    static let capacity = 10_000

    let vault: any TokenVault
    let lifetime: TimeInterval
    let now: @Sendable () -> Date

    /// `vault`: where sessions are kept, with the tokens; `now` is the clock (tests pass their own).
    public init(vault: any TokenVault, lifetime: TimeInterval = ConsoleSessions.defaultLifetime, now: @escaping @Sendable () -> Date = { Date() }) {
        self.vault = vault
        self.lifetime = lifetime
        self.now = now
    }

    /// A new session for a token already checked (``TokenVault/admin(for:now:)``); its id goes
    /// into the cookie. It ends no later than the token does.
    func open(_ caller: Caller, token: String) async throws -> (id: String, session: Session) {
        let id = Self.randomToken(), at = now()
        let end = min(at.addingTimeInterval(lifetime), caller.expiresAt ?? .distantFuture)
        let stored = StoredConsoleSession(key: Self.key(id), tokenName: caller.name, tokenSHA256: TokenFile.hash(token), expires: end, caller: caller)
        try await vault.openSession(stored, capacity: Self.capacity, now: at)
        return (id, Session(caller: caller, csrf: Self.csrf(id), expires: stored.expires))
    }

    /// A new session for a person the identity provider signed in (``SingleSignOn``): no token
    /// behind it; their role and scope, as their groups gave them, kept with it until it ends.
    func open(signedOn caller: Caller) async throws -> (id: String, session: Session) {
        let id = Self.randomToken(), at = now()
        let end = min(at.addingTimeInterval(lifetime), caller.expiresAt ?? .distantFuture)
        let stored = StoredConsoleSession(key: Self.key(id), tokenName: caller.name, tokenSHA256: "", expires: end, caller: caller)
        try await vault.openSession(stored, capacity: Self.capacity, now: at)
        return (id, Session(caller: caller, csrf: Self.csrf(id), expires: stored.expires, signedOn: true))
    }

    /// The live session of a cookie's id, whose token is still there (and has not expired),
    /// with the token's role and scope as they are now; one that ended is forgotten.
    func session(_ id: String) async throws -> Session? {
        guard Self.isWellFormed(id), let stored = try await vault.session(key: Self.key(id), now: now()), let caller = stored.caller else { return nil }
        return Session(caller: caller, csrf: Self.csrf(id), expires: stored.expires, signedOn: stored.isSignedOn)
    }

    func close(_ id: String) async throws {
        guard Self.isWellFormed(id) else { return }
        try await vault.closeSession(key: Self.key(id))
    }

    static func key(_ id: String) -> String { Hex.encode(SHA256.hash(data: Array(id.utf8))) }

    /// The CSRF token of the session `id`: an HMAC-SHA256 under the id, so it is the same
    /// after a restart and cannot be made without the cookie.
    static func csrf(_ id: String) -> String {
        Hex.encode(HMAC<SHA256>.authenticationCode(for: Array("dredge console csrf".utf8), using: SymmetricKey(data: Array(id.utf8))))
    }

    /// What ``randomToken()`` makes: 64 lowercase hex digits. Anything else names no session
    /// and is not looked up.
    static func isWellFormed(_ id: String) -> Bool {
        id.utf8.count == 64 && id.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// 256 random bits, hex.
    static func randomToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return Hex.encode((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// Whether two tokens are equal, in time that does not depend on where they differ.
    static func same(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count, !x.isEmpty else { return false }
        var difference: UInt8 = 0
        for i in 0..<x.count { difference |= x[i] ^ y[i] }
        return difference == 0
    }
}
