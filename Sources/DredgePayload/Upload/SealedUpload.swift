import Crypto
import DredgeEnvelope
import DredgeWire
import Foundation

/// The agent's side of an upload: an export zip on disk, its header, and chunks sealed on
/// demand (one chunk of memory each), so an upload of any size is sent with a window of chunks
/// in memory.
public final class SealedUpload: Sendable {
    public let header: WireUploadHeader
    public let cipher: ChunkCipher
    public let path: String
    private let fd: Int32

    /// - Parameters:
    ///   - wrappedKey: for feedback uploads and captures, the key wrapped under the server's RSA
    ///     key; empty for pulls (the server made the key).
    ///   - capture: what fired a capture (kind CAPTURE, Protocol § 21).
    public convenience init(
        zipPath: String, uploadID: String, kind: WireUploadKind, agentID: String, key: SymmetricKey,
        wrappedKey: [UInt8] = [], feedback: WireFeedback? = nil, capture: WireCapture? = nil, empty: Bool, createdAt: Int64,
        chunkSize: Int = WireLimits.defaultChunkBytes, noncePrefix: [UInt8] = secureRandomBytes(WireLimits.noncePrefixBytes)
    ) throws {
        var st = stat()
        guard stat(zipPath, &st) == 0, st.st_size >= 0 else { throw ExportError(.io, "cannot read \(zipPath)") }
        let size = UInt64(st.st_size)
        var h = WireUploadHeader()
        h.uploadID = uploadID
        h.kind = kind
        h.agentID = agentID
        h.noncePrefix = Data(noncePrefix)
        h.chunkSize = UInt32(chunkSize)
        h.plaintextSize = size
        h.chunkCount = UInt32(max(1, (size + UInt64(chunkSize) - 1) / UInt64(chunkSize)))
        h.wrappedKey = Data(wrappedKey)
        if let feedback { h.feedback = feedback }
        if let capture { h.capture = capture }
        h.empty = empty
        h.createdAtUs = createdAt
        try self.init(zipPath: zipPath, header: h, key: key)
    }

    /// The upload of `zipPath` under `header`; also reopens an upload after an agent restart.
    /// The zip must be the one the header describes.
    public init(zipPath: String, header: WireUploadHeader, key: SymmetricKey) throws {
        var st = stat()
        guard stat(zipPath, &st) == 0, UInt64(st.st_size) == header.plaintextSize else {
            throw ExportError(.uploadInvalid, "\(zipPath) is not the zip this upload's header describes")
        }
        do {
            cipher = try ChunkCipher(key: key, header: header)
        } catch let error as EnvelopeError {
            throw ExportError(.uploadInvalid, error.message)
        }
        self.header = header
        path = zipPath
        fd = open(zipPath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw ExportError(.io, "cannot open \(zipPath)") }
    }

    deinit { close(fd) }

    /// Chunk `index`, sealed.
    public func chunk(_ index: UInt32) throws -> [UInt8] {
        let length = cipher.plaintextSize(ofChunk: index)
        let offset = off_t(UInt64(index) * UInt64(header.chunkSize))
        // Read into memory that is not zeroed first: every byte is read or the call throws.
        let plaintext = try [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            var done = 0
            while done < length {
                let n = pread(fd, buffer.baseAddress.map { $0 + done }, length - done, offset + off_t(done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw ExportError(.io, "reading \(path) at \(offset + off_t(done))") }
                done += n
            }
            initialized = length
        }
        return try cipher.seal(plaintext, index: index)
    }
}
