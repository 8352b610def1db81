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
/// - A revoked token is refused at once. The last admin token cannot be revoked
///   (``TokenError/lastAdmin``): nobody could make another.
/// - A token is accepted only as the kind it was made for.
public protocol TokenVault: Sendable {
    /// The name of the admin token `token` is, or nil when it is not one.
    func adminName(for token: String) async throws -> String?
    func acceptsEnrollment(_ token: String) async throws -> Bool
    /// By kind, then name.
    func list() async throws -> [TokenInfo]
    /// Makes a token; the secret is in the result, and only its hash is kept.
    func create(name: String, kind: TokenKind, now: Date) async throws -> TokenCreated
    func revoke(name: String, kind: TokenKind) async throws
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
    let created: TokenCreated

    init(name: String, kind: TokenKind, now: Date) throws {
        guard !name.isEmpty, name.count <= 64, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }),
            !TokenError.reservedNames.contains(name)
        else {
            throw TokenError.invalidName(name)
        }
        let token = TokenFile.generate(kind)
        self.kind = kind
        self.name = name
        sha256 = TokenFile.hash(token)
        createdAt = now.timeIntervalSince1970
        created = TokenCreated(info: TokenInfo(name: name, kind: kind, createdAt: Date(timeIntervalSince1970: createdAt)), token: token)
    }
}
