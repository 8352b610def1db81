import Crypto
import DredgeWire
import Foundation

/// The server's Ed25519 key that signs pull commands (README § Pull commands). Agents pin the
/// public half at enrollment.
public struct ServerSigningKey: Sendable {
    let key: Curve25519.Signing.PrivateKey

    public static func generate() -> ServerSigningKey { ServerSigningKey(key: .init()) }

    public init(rawRepresentation raw: some ContiguousBytes) throws {
        do { key = try .init(rawRepresentation: raw) } catch { throw EnvelopeError(.invalidKey, "not a 32-byte Ed25519 private key") }
    }

    init(key: Curve25519.Signing.PrivateKey) { self.key = key }

    public var rawRepresentation: [UInt8] { Array(key.rawRepresentation) }
    public var verifyingKey: CommandVerifier { CommandVerifier(key: key.publicKey) }

    /// Fills in `signature` over the command's signing input.
    public func sign(_ command: inout WirePullCommand) throws {
        command.signature = Data(try key.signature(for: SigningInput.pullCommand(command)))
    }

    /// Fills in `signature` over the tail command's signing input (README § 20).
    public func sign(_ command: inout WireTailCommand) throws {
        command.signature = Data(try key.signature(for: SigningInput.tailCommand(command)))
    }

    /// Fills in `signature` over the trigger set's signing input (README § 21).
    public func sign(_ set: inout WireTriggerSet) throws {
        set.signature = Data(try key.signature(for: SigningInput.triggerSet(set)))
    }

    /// Fills in `signature` over the announcement's signing input: this key vouches for the
    /// next generation's keys (README § Key rotation).
    public func sign(_ announcement: inout WireKeyAnnouncement) throws {
        announcement.signature = Data(try key.signature(for: SigningInput.keyAnnouncement(announcement)))
    }
}

/// Checks pull commands against the pinned server key, as an agent must before running one.
public struct CommandVerifier: Sendable {
    let key: Curve25519.Signing.PublicKey

    public init(rawRepresentation raw: some ContiguousBytes) throws {
        do { key = try .init(rawRepresentation: raw) } catch { throw EnvelopeError(.invalidKey, "not a 32-byte Ed25519 public key") }
    }

    init(key: Curve25519.Signing.PublicKey) { self.key = key }

    public var rawRepresentation: [UInt8] { Array(key.rawRepresentation) }

    /// Throws `.unsigned` or `.badSignature`.
    public func verify(_ command: WirePullCommand) throws {
        guard !command.signature.isEmpty else { throw EnvelopeError(.unsigned, "command \(command.commandID) carries no signature") }
        guard key.isValidSignature(command.signature, for: SigningInput.pullCommand(command)) else {
            throw EnvelopeError(.badSignature, "command \(command.commandID) signature does not verify under the pinned server key")
        }
    }

    /// True when `command` carries a signature that verifies under this key.
    public func isValid(_ command: WirePullCommand) -> Bool {
        !command.signature.isEmpty && key.isValidSignature(command.signature, for: SigningInput.pullCommand(command))
    }

    /// True when the tail command carries a signature that verifies under this key.
    public func isValid(_ command: WireTailCommand) -> Bool {
        !command.signature.isEmpty && key.isValidSignature(command.signature, for: SigningInput.tailCommand(command))
    }

    /// True when the trigger set carries a signature that verifies under this key.
    public func isValid(_ set: WireTriggerSet) -> Bool {
        !set.signature.isEmpty && key.isValidSignature(set.signature, for: SigningInput.triggerSet(set))
    }

    /// True when `announcement` is signed by this key.
    public func isValid(_ announcement: WireKeyAnnouncement) -> Bool {
        !announcement.signature.isEmpty && key.isValidSignature(announcement.signature, for: SigningInput.keyAnnouncement(announcement))
    }
}
