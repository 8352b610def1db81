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
    }

    private func name(of token: String, kind: TokenKind) async throws -> String? {
        let hash = TokenFile.hash(token)
        // Every admin request and enrollment asks: a statement kept prepared.
        return try await db.read { try prepared("SELECT name FROM token WHERE sha256 = ? AND kind = ?", [hash, kind.rawValue], as: String.self).fetchOne($0) }
    }

    public func adminName(for token: String) async throws -> String? { try await name(of: token, kind: .admin) }
    public func acceptsEnrollment(_ token: String) async throws -> Bool { try await name(of: token, kind: .enrollment) != nil }

    public func list() async throws -> [TokenInfo] {
        try await db.read { db in
            try TokenRow.order(Column("kind"), Column("name")).fetchAll(db).map { row in
                guard let kind = TokenKind(rawValue: row.kind) else { throw DeploymentError("the stored kind of token \(row.name) is unreadable: \(row.kind)") }
                return TokenInfo(name: row.name, kind: kind, createdAt: Date(timeIntervalSince1970: row.createdAt))
            }
        }
    }

    public func create(name: String, kind: TokenKind, now: Date = Date()) async throws -> TokenCreated {
        let new = try NewToken(name: name, kind: kind, now: now)
        try await db.write { try Self.insert(new, into: $0) }
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
        try TokenRow(kind: new.kind.rawValue, name: new.name, sha256: new.sha256, createdAt: new.createdAt).insert(db)
    }

    /// Revokes a token at once. The last admin token cannot go: nobody could make another.
    public func revoke(name: String, kind: TokenKind) async throws {
        try await db.write { db in
            guard try TokenRow.deleteOne(db, key: ["kind": kind.rawValue, "name": name]) else { throw TokenError.unknown(name) }
            if kind == .admin, try TokenRow.filter(Column("kind") == TokenKind.admin.rawValue).fetchCount(db) == 0 { throw TokenError.lastAdmin }
        }
    }
}
