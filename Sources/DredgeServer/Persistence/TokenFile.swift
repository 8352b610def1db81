import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import DredgePayload
import Foundation

/// Tokens as deployments before the one database kept them (`tokens.json`, imported by
/// ``ServerDatabase``), and how tokens are made and hashed: by name and kind, as SHA-256 only.
/// A token is `dredge_adm_…` or `dredge_enr_…` with 192 random bits.
public struct TokenFile: Codable, Sendable, Equatable {
    public struct Entry: Codable, Sendable, Equatable {
        public var name: String
        public var kind: TokenKind
        public var sha256: String
        public var createdAt: Date

        public init(name: String, kind: TokenKind, token: String, createdAt: Date) {
            self.name = name
            self.kind = kind
            self.sha256 = TokenFile.hash(token)
            self.createdAt = createdAt
        }
    }

    public var tokens: [Entry]

    public init(tokens: [Entry]) { self.tokens = tokens }

    public static func hash(_ token: String) -> String { Hex.encode(SHA256.hash(data: Array(token.utf8))) }

    public static func generate(_ kind: TokenKind) -> String {
        (kind == .admin ? "dredge_adm_" : "dredge_enr_") + Hex.encode(secureRandomBytes(24))
    }
}

public enum TokenError: Error, CustomStringConvertible, Equatable, Sendable {
    case invalidName(String), exists(String), unknown(String), lastAdmin
    /// An expiry or a number of uses that cannot be.
    case limits(String)

    /// Actors the audit log uses for what no token did: a refused token (`-`) and the server
    /// host's own command line (`local-operator`).
    public static let reservedNames: Set<String> = ["-", "local-operator"]

    /// The tokens that keep a deployment administrable: admin tokens with the role admin and
    /// no expiry (a `WHERE` clause both back ends run). One must remain.
    static let lastingAdminSQL = "kind = 'admin' AND role = 'admin' AND expires_at IS NULL"

    public var description: String {
        switch self {
        case .invalidName(let name): "token name '\(name)' is not valid: 1 to 64 letters, digits, '-', '_' or '.', and not '-' or 'local-operator'"
        case .exists(let name): "a token named '\(name)' already exists"
        case .unknown(let name): "no token named '\(name)'"
        case .lastAdmin: "refusing to revoke the last admin token with the role admin and no expiry: create another first"
        case .limits(let problem): problem
        }
    }
}
