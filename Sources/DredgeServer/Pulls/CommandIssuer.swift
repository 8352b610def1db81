import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// The server's cryptography for pulls, kept out of storage: it makes each pull's AES key
/// (stored only wrapped under the server's encryption key), and turns a stored pull into the
/// signed command for one agent (the key rewrapped under that agent's public key).
public struct CommandIssuer: Sendable {
    let encryptionKey: RSAPrivateKey
    let signingKey: ServerSigningKey

    public init(encryptionKey: RSAPrivateKey, signingKey: ServerSigningKey) {
        self.encryptionKey = encryptionKey
        self.signingKey = signingKey
    }

    /// A new pull with a fresh id and key, ready to queue.
    public func newPull(uid: String, agentID: String, filter: LogFilter, targets: [String], lifetime: Duration, requestedBy: String, now: Timestamp = .now) throws -> NewPull {
        NewPull(
            id: Hex.encode(secureRandomBytes(16)), uid: uid, agentID: agentID, filter: filter, issuedAt: now, expiresAt: now.adding(lifetime),
            wrappedKey: try encryptionKey.publicKey.wrapKey(SymmetricKey.uploadKey()), requestedBy: requestedBy, targets: targets)
    }

    /// A pull's AES key, from its wrapped form.
    public func key(_ wrapped: [UInt8]) throws -> SymmetricKey {
        try encryptionKey.unwrapKey(wrapped)
    }

    /// The signed command of `pull` for `agent`. Throws ``UnreadablePull`` when its key does
    /// not unwrap (the pull can never be sent); other errors are passing.
    public func command(_ pull: StoredPull, agent: String, agentKey: RSAPublicKey) throws -> WirePullCommand {
        let key: SymmetricKey
        do {
            key = try encryptionKey.unwrapKey(pull.wrappedKey)
        } catch {
            throw UnreadablePull("the key of pull \(pull.id) does not unwrap: \(error)")
        }
        var command = WirePullCommand.with {
            $0.commandID = pull.id
            $0.target = .with { $0.uid = pull.uid; $0.agentID = agent }
            $0.filter = pull.filter.wire
            $0.issuedAtUs = pull.issuedAt.microseconds
            $0.expiresAtUs = pull.expiresAt.microseconds
        }
        command.wrappedKey = Data(try agentKey.wrapKey(key))
        try signingKey.sign(&command)
        return command
    }
}
