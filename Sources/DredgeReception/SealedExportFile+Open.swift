import Crypto
import DredgeEnvelope
import DredgePayload
import DredgeWire
import Foundation

extension SealedExportFile {
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
        guard try read(SealedExportFile.magic.count, "magic") == SealedExportFile.magic else { throw ExportError(.uploadInvalid, "\(path) is not a sealed Dredge export") }
        let headerLength = Int(SealedExportFile.u32(try read(4, "header length")))
        guard headerLength <= SealedExportFile.maxHeaderBytes else { throw ExportError(.uploadInvalid, "\(path): header of \(headerLength) bytes") }
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
            let length = Int(SealedExportFile.u32(try read(4, "chunk \(index) length")))
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
}
