import DredgeAdminAPI
import Foundation
import GRDB

/// The tokens in the server's database (``TokenVault``): each change is committed before it
/// takes effect, and every check reads the table, so a revocation holds at once, also for a
/// token revoked by another process on the same data directory.
public final class SQLiteTokenVault: TokenVault, Sendable {
    private let db: DatabasePool

    public init(_ database: ServerDatabase) { db = database.pool }

    static func schema(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("tokens-v1") { db in
            try db.execute(sql: """
                CREATE TABLE token (
                    kind TEXT NOT NULL,
                    name TEXT NOT NULL,
                    sha256 TEXT NOT NULL UNIQUE,
                    created_at REAL NOT NULL,
                    PRIMARY KEY (kind, name)
                ) WITHOUT ROWID;
                """)
        }
        // Console sessions outlive a restart (#50).
        migrator.registerMigration("console-sessions-v1") { db in
            try db.execute(sql: """
                CREATE TABLE console_session (
                    key TEXT PRIMARY KEY,
                    token_name TEXT NOT NULL,
                    token_sha256 TEXT NOT NULL,
                    expires_at REAL NOT NULL
                ) WITHOUT ROWID;
                CREATE INDEX console_session_by_expiry ON console_session(expires_at);
                CREATE INDEX console_session_by_token ON console_session(token_sha256);
                """)
        }
        // Enrollment tokens that expire, or have a number of uses (#56).
        migrator.registerMigration("tokens-v2-limits") { db in
            try db.execute(sql: "ALTER TABLE token ADD COLUMN expires_at REAL; ALTER TABLE token ADD COLUMN uses_left INTEGER")
        }
        // Admin tokens with a role and a scope (#55); the ones before were admins.
        migrator.registerMigration("tokens-v3-roles") { db in
            try db.execute(sql: "ALTER TABLE token ADD COLUMN role TEXT NOT NULL DEFAULT 'admin'; ALTER TABLE token ADD COLUMN scope TEXT")
        }
    }

    public func admin(for token: String, now: Date) async throws -> Caller? {
        let hash = TokenFile.hash(token)
        // Every admin request asks: a statement kept prepared.
        let row = try await db.read {
            try prepared("SELECT name, role, scope, expires_at FROM token WHERE sha256 = ? AND kind = 'admin'", [hash], as: Row.self).fetchOne($0)
        }
        guard let row else { return nil }
        return try Caller.stored(name: Caller.person(ofToken: row[0]), role: row[1], scope: row[2], expiresAt: row[3], now: now)
    }

    /// The enrollment token's name, expiry and uses left.
    private static func enrollment(_ token: String, in db: Database) throws -> (name: String, expiresAt: Double?, usesLeft: Int?)? {
        try prepared("SELECT name, expires_at, uses_left FROM token WHERE sha256 = ? AND kind = 'enrollment'", [TokenFile.hash(token)], as: Row.self)
            .fetchOne(db).map { ($0[0], $0[1], $0[2]) }
    }

    public func acceptsEnrollment(_ token: String, now: Date) async throws -> Bool {
        if case .accepted = EnrollmentTokenUse.decide(try await db.read { try Self.enrollment(token, in: $0) }, now: now) { return true }
        return false
    }

    public func useEnrollment(_ token: String, now: Date) async throws -> EnrollmentTokenUse {
        // A read decides most offers (an unknown token, one without a number of uses): only a
        // use to take needs the writer.
        let read = try await db.read { try Self.enrollment(token, in: $0) }
        guard case .accepted = EnrollmentTokenUse.decide(read, now: now), read?.usesLeft != nil else { return EnrollmentTokenUse.decide(read, now: now) }
        return try await db.write { db in
            let row = try Self.enrollment(token, in: db)
            let use = EnrollmentTokenUse.decide(row, now: now)
            if case .accepted(let name) = use, row?.usesLeft != nil {
                try db.execute(sql: "UPDATE token SET uses_left = uses_left - 1 WHERE kind = 'enrollment' AND name = ?", arguments: [name])
            }
            return use
        }
    }

    public func returnEnrollmentUse(_ token: String) async throws {
        let hash = TokenFile.hash(token)
        try await db.write { try $0.execute(sql: "UPDATE token SET uses_left = uses_left + 1 WHERE kind = 'enrollment' AND sha256 = ? AND uses_left IS NOT NULL", arguments: [hash]) }
    }

    public func list() async throws -> [TokenInfo] {
        try await db.read { db in
            try TokenRow.order(Column("kind"), Column("name")).fetchAll(db).map { row in
                guard let kind = TokenKind(rawValue: row.kind) else { throw DeploymentError("the stored kind of token \(row.name) is unreadable: \(row.kind)") }
                return TokenInfo(
                    name: row.name, kind: kind, createdAt: Date(timeIntervalSince1970: row.createdAt), expiresAt: row.expiresAt.map(Date.init(timeIntervalSince1970:)),
                    usesLeft: row.usesLeft, role: try TokenLimits.role(row.role, token: row.name), scope: try AccessScope.stored(row.scope, of: "admin token \(row.name)") ?? .everything)
            }
        }
    }

    public func create(name: String, kind: TokenKind, limits: TokenLimits, now: Date = Date()) async throws -> TokenCreated {
        let new = try NewToken(name: name, kind: kind, limits: limits, now: now)
        try await db.write { db in
            if limits.signedOn { try db.execute(sql: "DELETE FROM token WHERE \(TokenLimits.expiredSignedOnSQL(now: now))") }
            try Self.insert(new, into: db)
        }
        return new.created
    }

    /// ``create(name:kind:now:)`` for a deployment being made (no async context there yet).
    func createWhileInitializing(name: String, kind: TokenKind, now: Date) throws -> TokenCreated {
        let new = try NewToken(name: name, kind: kind, now: now)
        try db.write { try Self.insert(new, into: $0) }
        return new.created
    }

    private static func insert(_ new: NewToken, into db: Database) throws {
        guard try !TokenRow.exists(db, key: ["kind": new.kind.rawValue, "name": new.name]) else { throw TokenError.exists(new.name) }
        try TokenRow(
            kind: new.kind.rawValue, name: new.name, sha256: new.sha256, createdAt: new.createdAt, expiresAt: new.limits.expiresAt?.timeIntervalSince1970,
            usesLeft: new.limits.uses, role: new.limits.role.rawValue, scope: try new.limits.scope.storedJSON
        ).insert(db)
    }

    /// Revokes a token at once, and ends its console sessions. The last admin token with the
    /// role admin and no expiry cannot go: nobody could make another.
    public func revoke(name: String, kind: TokenKind) async throws {
        try await db.write { db in
            try db.execute(sql: "DELETE FROM console_session WHERE token_sha256 IN (SELECT sha256 FROM token WHERE kind = ? AND name = ?)", arguments: [kind.rawValue, name])
            guard try TokenRow.deleteOne(db, key: ["kind": kind.rawValue, "name": name]) else { throw TokenError.unknown(name) }
            if kind == .admin, try Int.fetchOne(db, sql: "SELECT count(*) FROM token WHERE \(TokenError.lastingAdminSQL)") == 0 { throw TokenError.lastAdmin }
        }
    }

    public func openSession(_ session: StoredConsoleSession, capacity: Int, now: Date) async throws {
        try await db.write { db in
            try db.execute(sql: "DELETE FROM console_session WHERE expires_at <= ?", arguments: [now.timeIntervalSince1970])
            let kept = try Int.fetchOne(db, sql: "SELECT count(*) FROM console_session") ?? 0
            if kept >= capacity {
                try db.execute(
                    sql: "DELETE FROM console_session WHERE key IN (SELECT key FROM console_session ORDER BY expires_at, key LIMIT ?)", arguments: [kept - capacity + 1])
            }
            let access = try session.keptAccess
            try db.execute(
                sql: "INSERT OR REPLACE INTO console_session (key, token_name, token_sha256, expires_at, role, scope) VALUES (?, ?, ?, ?, ?, ?)",
                arguments: [session.key, session.tokenName, session.tokenSHA256, session.expires.timeIntervalSince1970, access.role, access.scope])
        }
    }

    public func session(key: String, now: Date) async throws -> StoredConsoleSession? {
        // Every console request asks: one read, a statement kept prepared; a write only to
        // forget a session that has ended.
        let found = try await db.read { db -> (StoredConsoleSession, Bool)? in
            try prepared(
                """
                SELECT s.token_name, s.token_sha256, s.expires_at, t.name IS NOT NULL, t.role, t.scope, t.expires_at, s.role, s.scope FROM console_session s
                LEFT JOIN token t ON t.sha256 = s.token_sha256 AND t.kind = 'admin' WHERE s.key = ?
                """, [key], as: Row.self
            ).fetchOne(db).map { row in
                let sha256: String = row[1]
                let tokenLives: Bool = row[3]
                let caller = try StoredConsoleSession.caller(
                    name: row[0], tokenSHA256: sha256, kept: (row[7], row[8]), token: tokenLives ? (row[4], row[5], row[6]) : nil)
                return (StoredConsoleSession(key: key, tokenName: row[0], tokenSHA256: sha256, expires: Date(timeIntervalSince1970: row[2]), caller: caller), caller != nil)
            }
        }
        return try await live(found, at: now)
    }

    public func closeSession(key: String) async throws {
        try await db.write { try $0.execute(sql: "DELETE FROM console_session WHERE key = ?", arguments: [key]) }
    }
}
