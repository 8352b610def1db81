import DredgeAdminAPI
import Foundation
import PostgresNIO

/// The tokens in the PostgreSQL database (``TokenVault``), shared by every node: a token made or
/// revoked on one node holds on all of them at once (every check reads the table).
public final class PostgresTokenVault: TokenVault, Sendable {
    private let db: PostgresDatabase

    public init(_ database: PostgresDatabase) { db = database }

    public func admin(for token: String, now: Date) async throws -> Caller? {
        let hash = TokenFile.hash(token)
        guard let row = try await db.read({ try await $0.rows("SELECT name, role, scope, expires_at FROM token WHERE sha256 = \(hash) AND kind = 'admin'").first }) else {
            return nil
        }
        let (name, role, scope, expiresAt) = try row.decode((String, String, String?, Double?).self)
        return try Caller.stored(name: Caller.person(ofToken: name), role: role, scope: scope, expiresAt: expiresAt, now: now)
    }

    /// The enrollment token's name, expiry and uses left (`lock`: its row held to the transaction's end).
    private static func enrollment(_ token: String, lock: Bool, on c: PostgresConnection) async throws -> (name: String, expiresAt: Double?, usesLeft: Int?)? {
        let hash = TokenFile.hash(token)
        guard
            let row = try await c.rows(
                "SELECT name, expires_at, uses_left FROM token WHERE sha256 = \(hash) AND kind = 'enrollment' \(unescaped: lock ? "FOR UPDATE" : "")"
            ).first
        else { return nil }
        let (name, expiresAt, usesLeft) = try row.decode((String, Double?, Int32?).self)
        return (name, expiresAt, usesLeft.map(Int.init))
    }

    public func acceptsEnrollment(_ token: String, now: Date) async throws -> Bool {
        if case .accepted = EnrollmentTokenUse.decide(try await db.read { try await Self.enrollment(token, lock: false, on: $0) }, now: now) { return true }
        return false
    }

    public func useEnrollment(_ token: String, now: Date) async throws -> EnrollmentTokenUse {
        // A read decides most offers (an unknown token, one without a number of uses): only a
        // use to take locks the row.
        let read = try await db.read { try await Self.enrollment(token, lock: false, on: $0) }
        guard case .accepted = EnrollmentTokenUse.decide(read, now: now), read?.usesLeft != nil else { return EnrollmentTokenUse.decide(read, now: now) }
        return try await db.write { c in
            let row = try await Self.enrollment(token, lock: true, on: c)
            let use = EnrollmentTokenUse.decide(row, now: now)
            if case .accepted(let name) = use, row?.usesLeft != nil {
                try await c.run("UPDATE token SET uses_left = uses_left - 1 WHERE kind = 'enrollment' AND name = \(name)")
            }
            return use
        }
    }

    public func returnEnrollmentUse(_ token: String) async throws {
        let hash = TokenFile.hash(token)
        try await db.write { try await $0.run("UPDATE token SET uses_left = uses_left + 1 WHERE kind = 'enrollment' AND sha256 = \(hash) AND uses_left IS NOT NULL") }
    }

    public func list() async throws -> [TokenInfo] {
        try await db.read { c in
            try await c.rows("SELECT kind, name, created_at, expires_at, uses_left, role, scope FROM token ORDER BY kind, name").map { row in
                let (kindName, name, createdAt, expiresAt, usesLeft, role, scope) = try row.decode((String, String, Double, Double?, Int32?, String, String?).self)
                guard let kind = TokenKind(rawValue: kindName) else { throw DeploymentError("the stored kind of token \(name) is unreadable: \(kindName)") }
                return TokenInfo(
                    name: name, kind: kind, createdAt: Date(timeIntervalSince1970: createdAt), expiresAt: expiresAt.map(Date.init(timeIntervalSince1970:)),
                    usesLeft: usesLeft.map(Int.init), role: try TokenLimits.role(role, token: name), scope: try AccessScope.stored(scope, of: "admin token \(name)") ?? .everything)
            }
        }
    }

    public func create(name: String, kind: TokenKind, limits: TokenLimits, now: Date) async throws -> TokenCreated {
        let row = try NewToken(name: name, kind: kind, limits: limits, now: now)
        let (expiresAt, uses, role, scope) = (row.limits.expiresAt?.timeIntervalSince1970, row.limits.uses.map(Int32.init), row.limits.role.rawValue, try row.limits.scope.storedJSON)
        let inserted = try await db.write { c in
            if row.limits.signedOn { try await c.run("DELETE FROM token WHERE \(unescaped: TokenLimits.expiredSignedOnSQL(now: now))") }
            return try await c.run(
                """
                INSERT INTO token (kind, name, sha256, created_at, expires_at, uses_left, role, scope)
                VALUES (\(row.kind.rawValue), \(row.name), \(row.sha256), \(row.createdAt), \(expiresAt), \(uses), \(role), \(scope))
                ON CONFLICT (kind, name) DO NOTHING RETURNING 1
                """)
        }
        guard inserted > 0 else { throw TokenError.exists(name) }
        return row.created
    }

    /// Stores tokens made elsewhere (a deployment's first ones, by ``ServerDeployment``), all
    /// or none: a name already taken throws ``TokenError/exists(_:)``.
    func insert(_ rows: [NewToken]) async throws {
        try await db.write { c in
            for row in rows {
                let inserted = try await c.run(
                    """
                    INSERT INTO token (kind, name, sha256, created_at) VALUES (\(row.kind.rawValue), \(row.name), \(row.sha256), \(row.createdAt))
                    ON CONFLICT (kind, name) DO NOTHING RETURNING 1
                    """)
                guard inserted > 0 else { throw TokenError.exists(row.name) }
            }
        }
    }

    /// Revokes a token at once, and ends its console sessions. The last admin token with the
    /// role admin and no expiry cannot go: the admin rows are locked first, so two nodes
    /// revoking the last two at once cannot both succeed.
    public func revoke(name: String, kind: TokenKind) async throws {
        // A name no token can have (PostgreSQL's text cannot even hold a NUL) is unknown.
        guard !name.contains("\u{0}") else { throw TokenError.unknown(name) }
        try await db.write { c in
            try await c.run("SELECT name FROM token WHERE kind = \(TokenKind.admin.rawValue) FOR UPDATE")
            // Its console sessions end with it.
            try await c.run("DELETE FROM console_session WHERE token_sha256 IN (SELECT sha256 FROM token WHERE kind = \(kind.rawValue) AND name = \(name))")
            guard try await c.run("DELETE FROM token WHERE kind = \(kind.rawValue) AND name = \(name) RETURNING 1") > 0 else { throw TokenError.unknown(name) }
            let lasting = try await c.value(PostgresQuery(unsafeSQL: "SELECT count(*) FROM token WHERE \(TokenError.lastingAdminSQL)"), as: Int64.self) ?? 0
            if kind == .admin, lasting == 0 { throw TokenError.lastAdmin }
        }
    }

    public func openSession(_ session: StoredConsoleSession, capacity: Int, now: Date) async throws {
        let (nowSeconds, expires) = (now.timeIntervalSince1970, session.expires.timeIntervalSince1970)
        try await db.write { c in
            // Nodes opening sessions at once take turns at the cap (a lock of its own: 7466218401
            // is the schema's migrations, 7466218402 the record index's writes).
            try await c.run("SELECT pg_advisory_xact_lock(7466218403)")
            try await c.run("DELETE FROM console_session WHERE expires_at <= \(nowSeconds)")
            let kept = Int(try await c.value("SELECT count(*) FROM console_session", as: Int64.self) ?? 0)
            if kept >= capacity {
                let over = kept - capacity + 1
                try await c.run("DELETE FROM console_session WHERE key IN (SELECT key FROM console_session ORDER BY expires_at, key LIMIT \(over))")
            }
            let access = try session.keptAccess
            try await c.run(
                """
                INSERT INTO console_session (key, token_name, token_sha256, expires_at, role, scope)
                VALUES (\(session.key), \(session.tokenName), \(session.tokenSHA256), \(expires), \(access.role), \(access.scope))
                ON CONFLICT (key) DO UPDATE SET token_name = excluded.token_name, token_sha256 = excluded.token_sha256, expires_at = excluded.expires_at,
                    role = excluded.role, scope = excluded.scope
                """)
        }
    }

    public func session(key: String, now: Date) async throws -> StoredConsoleSession? {
        // A cookie no session can have (PostgreSQL's text cannot hold a NUL) names none.
        guard !key.contains("\u{0}") else { return nil }
        let found = try await db.read { c -> (StoredConsoleSession, Bool)? in
            try await c.rows(
                """
                SELECT s.token_name, s.token_sha256, s.expires_at, t.name IS NOT NULL, t.role, t.scope, t.expires_at, s.role, s.scope FROM console_session s
                LEFT JOIN token t ON t.sha256 = s.token_sha256 AND t.kind = 'admin' WHERE s.key = \(key)
                """
            ).first.map { row in
                let (name, sha256, expires, tokenLives, role, scope, tokenExpires, keptRole, keptScope) =
                    try row.decode((String, String, Double, Bool, String?, String?, Double?, String?, String?).self)
                let caller = try StoredConsoleSession.caller(
                    name: name, tokenSHA256: sha256, kept: (keptRole, keptScope), token: tokenLives ? (role, scope, tokenExpires) : nil)
                return (StoredConsoleSession(key: key, tokenName: name, tokenSHA256: sha256, expires: Date(timeIntervalSince1970: expires), caller: caller), caller != nil)
            }
        }
        return try await live(found, at: now)
    }

    public func closeSession(key: String) async throws {
        guard !key.contains("\u{0}") else { return }
        try await db.write { c in _ = try await c.run("DELETE FROM console_session WHERE key = \(key)") }
    }
}
