import Crypto
import DredgeEnvelope
import DredgeWire
import Foundation

/// Manual exports: the same zip a pull uploads, written to a file at the device, either as is
/// or sealed to a recipient's RSA public key (Protocol/README.md § 19):
///
/// ```
/// "DRDGEXP1" ‖ u32be(n) ‖ UploadHeader (n bytes, kind EXPORT, wrapped_key = the AES key under
/// the recipient's key) ‖ for each chunk i: u32be(m) ‖ the chunk sealed as in § 12 (m bytes)
/// ```
///
/// The envelope is the upload's (AES-256-GCM per chunk, nonce with index and last flag, header
/// digest as associated data), so a reordered, truncated, spliced or altered file fails.
public enum SealedExportFile {
    public static let magic = Array("DRDGEXP1".utf8)
    /// The most header bytes a reader accepts.
    public static let maxHeaderBytes = 64 * 1024

    /// Opens a sealed export with the recipient's private key into `directory` (per-day files
    /// and `manifest.json`, with the payload limits). Nothing is left in `directory` unless
    /// the whole file is authentic and the zip within the limits.
    public static func open(_ path: String, key: RSAPrivateKey, into directory: String, limits: PayloadLimits = PayloadLimits()) throws -> ExtractedPayload {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw ExportError(.io, "cannot open \(path)") }
        defer { try? handle.close() }
        func read(_ count: Int, _ what: String) throws -> [UInt8] {
            let data = (try? handle.read(upToCount: count)) ?? nil
            guard let data, data.count == count else { throw ExportError(.uploadInvalid, "\(path) is truncated (\(what))") }
            return Array(data)
        }
        guard try read(magic.count, "magic") == magic else { throw ExportError(.uploadInvalid, "\(path) is not a sealed Dredge export") }
        let headerLength = Int(u32(try read(4, "header length")))
        guard headerLength <= maxHeaderBytes else { throw ExportError(.uploadInvalid, "\(path): header of \(headerLength) bytes") }
        let header: WireUploadHeader
        do {
            header = try WireUploadHeader(serializedBytes: try read(headerLength, "header"))
        } catch let error as ExportError {
            throw error
        } catch {
            throw ExportError(.uploadInvalid, "\(path): unreadable header")
        }
        guard header.kind == .export else { throw ExportError(.uploadInvalid, "\(path): not an export (kind \(header.kind))") }
        let aes: SymmetricKey
        do {
            aes = try key.unwrapKey(header.wrappedKey)
        } catch {
            throw ExportError(.chunkAuthFailed, "\(path) was not sealed to this key")
        }
        let cipher: ChunkCipher
        do {
            cipher = try ChunkCipher(key: aes, header: header)
        } catch let error as EnvelopeError {
            throw ExportError(.uploadInvalid, "\(path): \(error.message)")
        }
        let zip = directory + ".zip.partial"
        defer { try? FileManager.default.removeItem(atPath: zip) }
        let out = try BufferedFile(creating: zip)
        for index in 0..<header.chunkCount {
            let length = Int(u32(try read(4, "chunk \(index) length")))
            guard length == cipher.plaintextSize(ofChunk: index) + 16 else { throw ExportError(.uploadInvalid, "\(path): chunk \(index) has the wrong length") }
            do {
                try out.write(try cipher.open(try read(length, "chunk \(index)"), index: index))
            } catch let error as EnvelopeError {
                throw ExportError(.chunkAuthFailed, "\(path): chunk \(index) does not authenticate (\(error.message))")
            }
        }
        guard ((try? handle.read(upToCount: 1)) ?? nil)?.isEmpty ?? true else { throw ExportError(.uploadInvalid, "\(path) has bytes after its last chunk") }
        try out.close()
        return try PayloadExtractor.extract(zip: zip, into: directory, limits: limits)
    }

    package static func publish(_ temporary: String, as path: String) throws {
        guard rename(temporary, path) == 0 else { throw ExportError(.io, "cannot write \(path): \(String(cString: strerror(errno)))") }
    }

    package static func u32(_ n: Int) -> [UInt8] { withUnsafeBytes(of: UInt32(n).bigEndian) { Array($0) } }
    package static func u32(_ bytes: [UInt8]) -> UInt32 { bytes.reduce(0) { $0 << 8 | UInt32($1) } }
}
