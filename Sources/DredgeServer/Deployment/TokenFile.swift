import Crypto
import DredgeAdminAPI
import DredgeEnvelope
import DredgePayload
import Foundation

/// The tokens the server accepts, by name and kind, as SHA-256 only: `tokens.json` does not
/// give them away. A token is `dredge_adm_…` or `dredge_enr_…` with 192 random bits.
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

        public var info: TokenInfo { TokenInfo(name: name, kind: kind, createdAt: createdAt) }
    }

    public var tokens: [Entry]

    public init(tokens: [Entry]) { self.tokens = tokens }

    public static func hash(_ token: String) -> String { Hex.encode(SHA256.hash(data: Array(token.utf8))) }

    public static func generate(_ kind: TokenKind) -> String {
        (kind == .admin ? "dredge_adm_" : "dredge_enr_") + Hex.encode(secureRandomBytes(24))
    }

    /// The name of the token of `kind` that `token` is, if the file accepts it.
    public func name(of token: String, kind: TokenKind) -> String? {
        let hash = Self.hash(token)
        return tokens.first { $0.kind == kind && $0.sha256 == hash }?.name
    }

    public func acceptsAdmin(_ token: String) -> Bool { name(of: token, kind: .admin) != nil }
    public func acceptsEnrollment(_ token: String) -> Bool { name(of: token, kind: .enrollment) != nil }
}

/// The running server's tokens: read at start, changed through the admin API, each change
/// written to `tokens.json` (temporary file, fsync, rename) before it takes effect.
public final class TokenStore: @unchecked Sendable {
    private let lock = NSLock()
    private var file: TokenFile
    let path: String

    public init(path: String, file: TokenFile) {
        self.path = path
        self.file = file
    }

    public var current: TokenFile { lock.withLock { file } }

    public func adminName(for token: String) -> String? { current.name(of: token, kind: .admin) }
    public func acceptsEnrollment(_ token: String) -> Bool { current.acceptsEnrollment(token) }
    public func list() -> [TokenInfo] { current.tokens.map(\.info) }

    /// Makes a token; the secret is returned once and only its hash is kept.
    public func create(name: String, kind: TokenKind, now: Date = Date()) throws -> TokenCreated {
        guard !name.isEmpty, name.count <= 64, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }) else {
            throw TokenError.invalidName(name)
        }
        let token = TokenFile.generate(kind)
        let entry = TokenFile.Entry(name: name, kind: kind, token: token, createdAt: now)
        try lock.withLock {
            guard !file.tokens.contains(where: { $0.kind == kind && $0.name == name }) else { throw TokenError.exists(name) }
            var next = file
            next.tokens.append(entry)
            try save(next)
            file = next
        }
        return TokenCreated(info: entry.info, token: token)
    }

    /// Revokes a token at once. The last admin token cannot go: nobody could make another.
    public func revoke(name: String, kind: TokenKind) throws {
        try lock.withLock {
            guard file.tokens.contains(where: { $0.kind == kind && $0.name == name }) else { throw TokenError.unknown(name) }
            var next = file
            next.tokens.removeAll { $0.kind == kind && $0.name == name }
            if kind == .admin && !next.tokens.contains(where: { $0.kind == .admin }) { throw TokenError.lastAdmin }
            try save(next)
            file = next
        }
    }

    private func save(_ next: TokenFile) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        try DurableFile.write(Array(try encoder.encode(next)) + [10], to: path)
    }
}

public enum TokenError: Error, CustomStringConvertible, Equatable, Sendable {
    case invalidName(String), exists(String), unknown(String), lastAdmin

    public var description: String {
        switch self {
        case .invalidName(let name): "token name '\(name)' is not valid: 1 to 64 letters, digits, '-', '_' or '.'"
        case .exists(let name): "a token named '\(name)' already exists"
        case .unknown(let name): "no token named '\(name)'"
        case .lastAdmin: "refusing to revoke the last admin token: create another first"
        }
    }
}
