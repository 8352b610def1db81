import Crypto
import DredgeWire
import Foundation

/// The seal of a live tail's batches (README § 20): AES-256-GCM under the tail's own key, with
/// a random 12-byte nonce per batch and, as associated data, the canonical tail id, agent id,
/// seq, dropped count and store cursor. So a batch cannot be read, changed, moved in the stream
/// or to another tail or agent, or have its count of left-out records or its cursor changed
/// without failing. The nonce is random, not the seq: an agent that restarted numbers on from
/// what the server holds, so one seq can seal two different batches.
public struct TailCipher: Sendable {
    public let tailID: String
    public let agentID: String
    private let key: SymmetricKey
    public static let nonceBytes = 12

    public init(key: SymmetricKey, tailID: String, agentID: String) throws {
        guard key.bitCount == 256 else { throw EnvelopeError(.invalidKey, "tail keys are 256 bits") }
        self.key = key
        self.tailID = tailID
        self.agentID = agentID
    }

    public func associatedData(seq: UInt64, dropped: UInt64, cursor: UInt64) -> [UInt8] {
        SigningInput.tailBatch(tailID: tailID, agentID: agentID, seq: seq, dropped: dropped, cursor: cursor)
    }

    /// Ciphertext ‖ tag of batch `seq`, sealed under a fresh random nonce.
    public func seal(_ plaintext: some DataProtocol, seq: UInt64, dropped: UInt64, cursor: UInt64) throws -> (nonce: [UInt8], sealed: [UInt8]) {
        try seal(plaintext, seq: seq, dropped: dropped, cursor: cursor, nonce: secureRandomBytes(Self.nonceBytes))
    }

    /// The same under a given nonce: for the protocol's vector only (a nonce must never repeat
    /// under a key).
    package func seal(_ plaintext: some DataProtocol, seq: UInt64, dropped: UInt64, cursor: UInt64, nonce: [UInt8]) throws -> (nonce: [UInt8], sealed: [UInt8]) {
        guard seq >= 1, nonce.count == Self.nonceBytes else { throw EnvelopeError(.invalidUpload, "tail batches are numbered from 1, with 12-byte nonces") }
        let box = try AES.GCM.seal(
            plaintext, using: key, nonce: try AES.GCM.Nonce(data: nonce), authenticating: associatedData(seq: seq, dropped: dropped, cursor: cursor))
        var out: [UInt8] = []
        out.reserveCapacity(box.ciphertext.count + box.tag.count)
        out.append(contentsOf: box.ciphertext)
        out.append(contentsOf: box.tag)
        guard out.count <= WireLimits.maxTailBatchBytes else {
            throw EnvelopeError(.invalidUpload, "a tail batch of \(out.count) bytes is over \(WireLimits.maxTailBatchBytes)")
        }
        return (nonce, out)
    }

    /// The plaintext of a batch, or `.chunkAuthFailed`.
    public func open(_ sealed: some DataProtocol, nonce: some DataProtocol, seq: UInt64, dropped: UInt64, cursor: UInt64) throws -> Data {
        guard seq >= 1, nonce.count == Self.nonceBytes, sealed.count >= WireLimits.tagBytes, sealed.count <= WireLimits.maxTailBatchBytes else {
            throw EnvelopeError(.invalidUpload, "tail batch \(seq) breaks the limits (\(sealed.count) bytes, a \(nonce.count)-byte nonce)")
        }
        do {
            let box = try AES.GCM.SealedBox(
                nonce: try AES.GCM.Nonce(data: nonce), ciphertext: sealed.dropLast(WireLimits.tagBytes), tag: sealed.suffix(WireLimits.tagBytes))
            return try AES.GCM.open(box, using: key, authenticating: associatedData(seq: seq, dropped: dropped, cursor: cursor))
        } catch {
            throw EnvelopeError(.chunkAuthFailed, "tail batch \(seq) does not authenticate")
        }
    }
}
