import Crypto
import DredgeWire
import Foundation

/// Streaming AEAD for uploads (README § Envelope): AES-256-GCM per chunk with
///
/// - nonce (12 bytes) = nonce_prefix (7, random per upload) ‖ chunk index (u32 big-endian) ‖
///   last flag (0x01 on the final chunk, 0x00 otherwise);
/// - associated data = SHA-256 of the header's canonical bytes.
///
/// So a reordered chunk fails (index in the nonce), a truncated upload fails (no chunk can pass
/// as last but the real one), a chunk spliced from another upload fails (different prefix and
/// header digest), and any changed byte fails (the tag).
public struct ChunkCipher: Sendable {
    public let header: WireUploadHeader
    public let associatedData: [UInt8]
    private let key: SymmetricKey

    /// Checks the header's envelope fields: prefix length, chunk size and count consistent with
    /// the plaintext size, within the protocol limits.
    public init(key: SymmetricKey, header: WireUploadHeader) throws {
        guard key.bitCount == 256 else { throw EnvelopeError(.invalidKey, "upload keys are 256 bits") }
        try Self.validate(header)
        self.key = key
        self.header = header
        self.associatedData = Array(SHA256.hash(data: SigningInput.uploadHeader(header)))
    }

    public static func validate(_ h: WireUploadHeader) throws {
        guard h.noncePrefix.count == WireLimits.noncePrefixBytes else {
            throw EnvelopeError(.invalidUpload, "nonce prefix is \(h.noncePrefix.count) bytes, not \(WireLimits.noncePrefixBytes)")
        }
        guard (WireLimits.minChunkBytes...WireLimits.maxChunkBytes).contains(Int(h.chunkSize)) else {
            throw EnvelopeError(.invalidUpload, "chunk size \(h.chunkSize) outside \(WireLimits.minChunkBytes)...\(WireLimits.maxChunkBytes)")
        }
        // Without overflow for any plaintext_size a peer may claim.
        let size = UInt64(h.chunkSize)
        let expected = max(1, h.plaintextSize / size + (h.plaintextSize % size == 0 ? 0 : 1))
        guard UInt64(h.chunkCount) == expected, h.chunkCount <= WireLimits.maxChunkCount else {
            throw EnvelopeError(.invalidUpload, "chunk count \(h.chunkCount) does not fit \(h.plaintextSize) bytes in chunks of \(h.chunkSize)")
        }
    }

    /// Bytes of plaintext chunk `index` carries.
    public func plaintextSize(ofChunk index: UInt32) -> Int {
        let size = UInt64(header.chunkSize)
        if index + 1 < header.chunkCount { return Int(size) }
        return Int(header.plaintextSize - UInt64(header.chunkCount - 1) * size)
    }

    public func nonce(index: UInt32) -> [UInt8] {
        var n = Array(header.noncePrefix)
        withUnsafeBytes(of: index.bigEndian) { n.append(contentsOf: $0) }
        n.append(index + 1 == header.chunkCount ? 1 : 0)
        return n
    }

    /// Ciphertext ‖ tag of chunk `index`.
    public func seal(_ plaintext: some DataProtocol, index: UInt32) throws -> [UInt8] {
        guard index < header.chunkCount, plaintext.count == plaintextSize(ofChunk: index) else {
            throw EnvelopeError(.invalidUpload, "chunk \(index) of \(plaintext.count) bytes does not fit the header")
        }
        let box = try AES.GCM.seal(plaintext, using: key, nonce: try AES.GCM.Nonce(data: nonce(index: index)), authenticating: associatedData)
        // One copy, into room for both (an array of the ciphertext alone grew, and was copied
        // again, to take the tag).
        var out: [UInt8] = []
        out.reserveCapacity(box.ciphertext.count + box.tag.count)
        out.append(contentsOf: box.ciphertext)
        out.append(contentsOf: box.tag)
        return out
    }

    /// The plaintext of chunk `index`, or `.chunkAuthFailed`. No copy of our own on either side
    /// (a chunk is up to 2 MiB, and the server opens every chunk of every upload): the sealed
    /// box copies the ciphertext once, and the plaintext is what AES-GCM returned.
    public func open(_ sealed: some DataProtocol, index: UInt32) throws -> Data {
        guard index < header.chunkCount, sealed.count == plaintextSize(ofChunk: index) + WireLimits.tagBytes else {
            throw EnvelopeError(.invalidUpload, "chunk \(index) of \(sealed.count) bytes does not fit the header")
        }
        do {
            let box = try AES.GCM.SealedBox(
                nonce: try AES.GCM.Nonce(data: nonce(index: index)), ciphertext: sealed.dropLast(WireLimits.tagBytes),
                tag: sealed.suffix(WireLimits.tagBytes))
            return try AES.GCM.open(box, using: key, authenticating: associatedData)
        } catch {
            throw EnvelopeError(.chunkAuthFailed, "chunk \(index) does not authenticate")
        }
    }
}

extension SymmetricKey {
    /// A fresh random AES-256 key for one upload.
    public static func uploadKey() -> SymmetricKey { SymmetricKey(size: .bits256) }
}

/// Random bytes from the system generator.
public func secureRandomBytes(_ count: Int) -> [UInt8] {
    var rng = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
}
