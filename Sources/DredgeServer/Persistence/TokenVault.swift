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
