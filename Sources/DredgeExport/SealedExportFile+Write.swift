import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeStore
import DredgeWire
import Foundation

extension SealedExportFile {
    /// Exports `filter` from `store` to `path`: the zip itself, or sealed to `recipient`.
    /// Written beside `path` and renamed, so `path` is whole or absent. Returns the manifest.
    @discardableResult
    public static func write(
        from store: LogStore, filter: LogFilter, agentID: String = "", to path: String, recipient: RSAPublicKey? = nil, now: Timestamp = .now
    ) throws -> ExportManifest {
        let id = Hex.encode(secureRandomBytes(16))
        let zip = path + ".\(id).zip.partial"
        defer { try? FileManager.default.removeItem(atPath: zip) }
        let manifest = try Exporter.export(
            from: store, ExportRequest(uploadID: id, kind: .export, agentID: agentID, filter: filter, createdAt: now), to: zip)
        guard let recipient else {
            try publish(zip, as: path)
            return manifest
        }
        let key = SymmetricKey.uploadKey()
        let sealed = try SealedUpload(
            zipPath: zip, uploadID: id, kind: .export, agentID: agentID, key: key, wrappedKey: try recipient.wrapKey(key),
            empty: manifest.empty, createdAt: now.microseconds)
        let temporary = path + ".\(id).partial"
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        let file = try BufferedFile(creating: temporary)
        let header = Array(try sealed.header.serializedBytes() as Data)
        try file.write(magic + u32(header.count) + header)
        for index in 0..<sealed.header.chunkCount {
            let chunk = try sealed.chunk(index)
            try file.write(u32(chunk.count) + chunk)
        }
        try file.close()
        try publish(temporary, as: path)
        return manifest
    }
}
