import Crypto
import DredgeWire
import Foundation

/// The seal of a live tail's batches (README § 20): AES-256-GCM under the tail's own key, with
///
/// - nonce (12 bytes) = ASCII "tail" ‖ seq (u64 big-endian);
/// - associated data = the canonical tail id, agent id, seq and dropped count.
///
/// So a batch cannot be read, changed, moved in the stream or to another tail or agent, or have
/// its count of left-out records changed without failing. A key is made per tail and agent and
/// a seq is used once (a batch sent again is the same bytes), so no nonce seals two plaintexts.
public struct TailCipher: Sendable {
    public let tailID: String
    public let agentID: String
    private let key: SymmetricKey

    public init(key: SymmetricKey, tailID: String, agentID: String) throws {
        guard key.bitCount == 256 else { throw EnvelopeError(.invalidKey, "tail keys are 256 bits") }
        self.key = key
        self.tailID = tailID
        self.agentID = agentID
    }

    public static func nonce(seq: UInt64) -> [UInt8] {
        var n = Array("tail".utf8)
        withUnsafeBytes(of: seq.bigEndian) { n.append(contentsOf: $0) }
        return n
    }

    public func associatedData(seq: UInt64, dropped: UInt64) -> [UInt8] {
        SigningInput.tailBatch(tailID: tailID, agentID: agentID, seq: seq, dropped: dropped)
    }

    /// Ciphertext ‖ tag of batch `seq`.
    public func seal(_ plaintext: some DataProtocol, seq: UInt64, dropped: UInt64) throws -> [UInt8] {
        guard seq >= 1 else { throw EnvelopeError(.invalidUpload, "tail batches are numbered from 1") }
        let box = try AES.GCM.seal(
            plaintext, using: key, nonce: try AES.GCM.Nonce(data: Self.nonce(seq: seq)), authenticating: associatedData(seq: seq, dropped: dropped))
        var out: [UInt8] = []
        out.reserveCapacity(box.ciphertext.count + box.tag.count)
        out.append(contentsOf: box.ciphertext)
        out.append(contentsOf: box.tag)
        guard out.count <= WireLimits.maxTailBatchBytes else {
            throw EnvelopeError(.invalidUpload, "a tail batch of \(out.count) bytes is over \(WireLimits.maxTailBatchBytes)")
        }
        return out
    }

    /// The plaintext of batch `seq`, or `.chunkAuthFailed`.
    public func open(_ sealed: some DataProtocol, seq: UInt64, dropped: UInt64) throws -> Data {
        guard seq >= 1, sealed.count >= WireLimits.tagBytes, sealed.count <= WireLimits.maxTailBatchBytes else {
            throw EnvelopeError(.invalidUpload, "tail batch \(seq) of \(sealed.count) bytes breaks the limits")
        }
        do {
            let box = try AES.GCM.SealedBox(
                nonce: try AES.GCM.Nonce(data: Self.nonce(seq: seq)), ciphertext: sealed.dropLast(WireLimits.tagBytes), tag: sealed.suffix(WireLimits.tagBytes))
            return try AES.GCM.open(box, using: key, authenticating: associatedData(seq: seq, dropped: dropped))
        } catch {
            throw EnvelopeError(.chunkAuthFailed, "tail batch \(seq) does not authenticate")
        }
    }
}
