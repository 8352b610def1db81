import Crypto
import Foundation
import _CryptoExtras

/// An RSA key pair: the agent's identity and key-wrapping key, and the server's key for
/// feedback uploads. One key serves two schemes that never share padding: RSA-OAEP-SHA256
/// (MGF1-SHA256, empty label) to unwrap keys, RSA-PSS-SHA256 (MGF1-SHA256, 32-byte salt) to sign
/// authentication challenges.
///
/// Only the signing keys are kept: _CryptoExtras declares them Sendable but not its encryption
/// keys, so a key is read as one from the same DER for each wrap or unwrap (once per pull, a
/// small cost beside the RSA operation itself).
public struct RSAPrivateKey: Sendable {
    let signing: _RSA.Signing.PrivateKey

    /// Generates a new 3072-bit key.
    public static func generate() throws -> RSAPrivateKey {
        let signing = try _RSA.Signing.PrivateKey(keySize: .bits3072)
        return try RSAPrivateKey(derRepresentation: signing.derRepresentation)
    }

    public init(derRepresentation der: some DataProtocol) throws {
        do {
            signing = try _RSA.Signing.PrivateKey(derRepresentation: der)
        } catch {
            throw EnvelopeError(.invalidKey, "not an RSA private key of 2048 bits or more: \(error)")
        }
    }

    public init(pemRepresentation pem: String) throws {
        do {
            signing = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw EnvelopeError(.invalidKey, "not an RSA private key of 2048 bits or more: \(error)")
        }
    }

    public var pemRepresentation: String { signing.pkcs8PEMRepresentation }
    public var derRepresentation: Data { signing.derRepresentation }
    public var publicKey: RSAPublicKey { try! RSAPublicKey(spki: signing.publicKey.derRepresentation) }

    /// Recovers an AES-256 key wrapped with RSA-OAEP-SHA256 under this key's public half.
    public func unwrapKey(_ wrapped: some DataProtocol) throws -> SymmetricKey {
        let encryption: _RSA.Encryption.PrivateKey
        do {
            encryption = try _RSA.Encryption.PrivateKey(derRepresentation: signing.derRepresentation)
        } catch {
            throw EnvelopeError(.invalidKey, "this key cannot be read as an RSA-OAEP key: \(error)")
        }
        let raw: Data
        do {
            raw = try encryption.decrypt(wrapped, padding: .PKCS1_OAEP_SHA256)
        } catch {
            throw EnvelopeError(.keyUnwrapFailed, "the wrapped key does not decrypt under this key")
        }
        guard raw.count == 32 else { throw EnvelopeError(.keyUnwrapFailed, "the wrapped key is \(raw.count) bytes, not 32") }
        return SymmetricKey(data: raw)
    }

    /// RSA-PSS-SHA256 over `message`.
    public func sign(_ message: [UInt8]) throws -> [UInt8] {
        Array(try signing.signature(for: message, padding: .PSS).rawRepresentation)
    }
}

/// The public half: SubjectPublicKeyInfo DER on the wire.
public struct RSAPublicKey: Sendable, Hashable {
    public let spki: [UInt8]
    let signing: _RSA.Signing.PublicKey

    public init(spki: some DataProtocol) throws {
        self.spki = Array(spki)
        do {
            signing = try _RSA.Signing.PublicKey(derRepresentation: self.spki)
        } catch {
            throw EnvelopeError(.invalidKey, "not an RSA public key of 2048 bits or more")
        }
        guard signing.keySizeInBits <= 4096 else { throw EnvelopeError(.invalidKey, "RSA keys over 4096 bits are not accepted") }
        // Exactly SubjectPublicKeyInfo DER: the agent id is a hash of these bytes, so another
        // encoding of the same key (PKCS#1) would give another id.
        guard Array(signing.derRepresentation) == self.spki else {
            throw EnvelopeError(.invalidKey, "not SubjectPublicKeyInfo DER (PKCS#1 and other encodings are refused)")
        }
    }

    public init(pemRepresentation pem: String) throws {
        do {
            try self.init(spki: try _RSA.Signing.PublicKey(pemRepresentation: pem).derRepresentation)
        } catch let error as EnvelopeError {
            throw error
        } catch {
            throw EnvelopeError(.invalidKey, "not an RSA public key PEM")
        }
    }

    public var pemRepresentation: String { signing.pemRepresentation }

    /// The id of the agent holding this key (README § Identities): the first 16 bytes of
    /// SHA-256 over the SubjectPublicKeyInfo DER, in lowercase hex.
    public var agentID: String { Hex.encode(Array(SHA256.hash(data: spki).prefix(16))) }

    /// RSA-OAEP-SHA256 of the 32 key bytes.
    public func wrapKey(_ key: SymmetricKey) throws -> [UInt8] {
        let encryption = try _RSA.Encryption.PublicKey(derRepresentation: spki)
        return try key.withUnsafeBytes { Array(try encryption.encrypt(Data($0), padding: .PKCS1_OAEP_SHA256)) }
    }

    public func isValidSignature(_ signature: [UInt8], for message: [UInt8]) -> Bool {
        signing.isValidSignature(_RSA.Signing.RSASignature(rawRepresentation: signature), for: message, padding: .PSS)
    }

    public static func == (a: RSAPublicKey, b: RSAPublicKey) -> Bool { a.spki == b.spki }
    public func hash(into hasher: inout Hasher) { hasher.combine(spki) }
}

/// Lowercase hex, as ids and test vectors use it.
public enum Hex {
    public static func encode(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: c - 48
            case 97...102: c - 87
            case 65...70: c - 55
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        var i = 0
        while i < chars.count {
            guard let hi = value(chars[i]), let lo = value(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }
}
