import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeExport

/// The independent check: Python (`cryptography` and the standard `zipfile`), written from
/// Protocol/README.md, verifies the vectors and decrypts an upload made here.
@Suite struct InteropTests {
    static func python(_ script: String, _ argument: String) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Vectors.repositoryRoot.appendingPathComponent("Tests/interop/\(script)").path, argument]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }

    @Test func pythonVerifiesTheVectors() throws {
        let (status, output) = try Self.python("check_vectors.py", Vectors.directory.path)
        #expect(status == 0, "\(output)")
        #expect(output.contains("all vectors hold"))
    }

    @Test func pythonDecryptsAnUploadMadeBySwift() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 30_000)
        let filter = LogFilter(types: [.network, .business])
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0f", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0f", filter: filter), to: dir.file("export.zip"))
        let key = SymmetricKey.uploadKey()
        let upload = try SealedUpload(zipPath: dir.file("export.zip"), uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0f", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0f", key: key, empty: manifest.empty, createdAt: Timestamp.now.microseconds)
        let out = dir.file("py")
        try FileManager.default.createDirectory(atPath: out + "/chunks", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: out + "/expected", withIntermediateDirectories: true)
        for i in 0..<upload.header.chunkCount { FileManager.default.createFile(atPath: "\(out)/chunks/\(i)", contents: Data(try upload.chunk(i))) }
        for (name, text) in try expectedDays(store, filter) { FileManager.default.createFile(atPath: "\(out)/expected/\(name)", contents: Data(text.utf8)) }
        let h = upload.header
        let description: [String: Any] = [
            "key": key.withUnsafeBytes { Hex.encode($0) },
            "header": [
                "upload_id": h.uploadID, "kind": h.kind.rawValue, "agent_id": h.agentID, "nonce_prefix": Hex.encode(h.noncePrefix),
                "chunk_size": h.chunkSize, "plaintext_size": h.plaintextSize, "chunk_count": h.chunkCount, "wrapped_key": "",
                "empty": h.empty, "created_at_us": h.createdAtUs,
            ] as [String: Any],
        ]
        try JSONSerialization.data(withJSONObject: description).write(to: URL(fileURLWithPath: out + "/upload.json"))
        #expect(upload.header.chunkCount > 2)
        let (status, output) = try Self.python("check_upload.py", out)
        #expect(status == 0, "\(output)")
        #expect(output.contains("ok: rejected a truncated upload"))
    }
}
