import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeReception
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeExport

@Suite struct UploadTests {
    func exported(_ dir: TempDir, count: Int = 8_000) throws -> (LogStore, ExportManifest, SealedUpload, SymmetricKey) {
        let store = try makeStore(in: dir, count: count)
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a07", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b07", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a07", filter: .all), to: dir.file("export.zip"))
        let key = SymmetricKey.uploadKey()
        let upload = try SealedUpload(
            zipPath: dir.file("export.zip"), uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a07", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b07", key: key, empty: manifest.empty,
            createdAt: Timestamp.now.microseconds, chunkSize: 16 * 1024)
        return (store, manifest, upload, key)
    }

    @Test func chunksArrivingInAnyOrderWithResendsReassembleToTheSameFiles() throws {
        let dir = TempDir()
        let (store, manifest, upload, key) = try exported(dir)
        #expect(upload.header.chunkCount > 10)
        let assembler = try UploadAssembler(directory: dir.file("incoming/up-7"), header: upload.header, key: key)
        var order = Array(0..<upload.header.chunkCount).shuffled()
        order += order.prefix(5)  // idempotent re-sends
        for index in order { try assembler.accept(index: index, ciphertext: try upload.chunk(index)) }
        #expect(assembler.isComplete)
        try assembler.assemble(to: dir.file("received.zip"))
        #expect(FileManager.default.contents(atPath: dir.file("received.zip")) == FileManager.default.contents(atPath: dir.file("export.zip")))
        let payload = try PayloadExtractor.extract(zip: dir.file("received.zip"), into: dir.file("files"))
        #expect(payload.manifest == manifest)
        let expected = try expectedDays(store, .all)
        for file in payload.files { #expect(contents(file) == expected[(file as NSString).lastPathComponent]) }
    }

    @Test func aReceiverRestartKeepsEveryAcceptedChunk() throws {
        let dir = TempDir()
        let (_, _, upload, key) = try exported(dir)
        let path = dir.file("incoming/up-7")
        do {
            let first = try UploadAssembler(directory: path, header: upload.header, key: key)
            for index in stride(from: 0, to: upload.header.chunkCount, by: 2) { try first.accept(index: index, ciphertext: try upload.chunk(index)) }
        }
        // A new process: only the directory and the key.
        let resumed = try UploadAssembler(resuming: path, key: key)
        let held = ChunkBitmap.decode(resumed.receivedBitmap, count: upload.header.chunkCount)
        #expect(held == Set(stride(from: 0, to: upload.header.chunkCount, by: 2)))
        #expect(!resumed.isComplete)
        #expect((#expect(throws: ExportError.self) { try resumed.assemble(to: dir.file("r.zip")) })?.code == .incomplete)
        for index in 0..<upload.header.chunkCount where !held.contains(index) { try resumed.accept(index: index, ciphertext: try upload.chunk(index)) }
        try resumed.assemble(to: dir.file("r.zip"))
        _ = try PayloadExtractor.extract(zip: dir.file("r.zip"), into: dir.file("files"))
        // The same upload id with a different header is refused.
        var other = upload.header
        other.noncePrefix = Data([9, 9, 9, 9, 9, 9, 9])
        #expect(throws: ExportError.self) { try UploadAssembler(directory: path, header: other, key: key) }
    }

    @Test func aTamperedOrForeignChunkIsRejectedAndNotStored() throws {
        let dir = TempDir()
        let (_, _, upload, key) = try exported(dir)
        let assembler = try UploadAssembler(directory: dir.file("incoming/up-7"), header: upload.header, key: key)
        var chunk = try upload.chunk(3)
        chunk[chunk.count / 2] ^= 0x01
        #expect((#expect(throws: ExportError.self) { try assembler.accept(index: 3, ciphertext: chunk) })?.code == .chunkAuthFailed)
        #expect((#expect(throws: ExportError.self) { try assembler.accept(index: 4, ciphertext: try upload.chunk(3)) })?.code == .chunkAuthFailed)
        #expect((#expect(throws: ExportError.self) { try assembler.accept(index: 99_999, ciphertext: try upload.chunk(3)) })?.code == .uploadInvalid)
        #expect(assembler.received.isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.file("incoming/up-7/chunks")).isEmpty)
    }

    @Test func bitmapsRoundTrip() {
        let set: Set<UInt32> = [0, 2, 7, 8, 15, 16]
        let bytes = ChunkBitmap.encode(set, count: 17)
        #expect(bytes == [0b1000_0101, 0b1000_0001, 0b0000_0001])
        #expect(ChunkBitmap.decode(bytes, count: 17) == set)
        #expect(ChunkBitmap.decode([0xFF, 0xFF, 0xFF], count: 17).count == 17)
    }

    @Test(.enabled(if: TmpfsMount.isSupported)) func aFullDiskOnTheReceiverRefusesTheChunkAndKeepsTheRest() throws {
        let dir = TempDir()
        let (_, _, upload, key) = try exported(dir, count: 80_000)
        #expect(upload.header.plaintextSize > 2_000_000)
        let mount = try TmpfsMount(megabytes: 1)
        defer { mount.remove() }
        let assembler = try UploadAssembler(directory: mount.path + "/up-7", header: upload.header, key: key)
        var stored: Set<UInt32> = []
        var failure: ExportError?
        for index in 0..<upload.header.chunkCount {
            do {
                try assembler.accept(index: index, ciphertext: try upload.chunk(index))
                stored.insert(index)
            } catch let error as ExportError {
                failure = error
                break
            }
        }
        #expect(failure?.code == .diskFull, "the upload needs more than the 1 MiB disk")
        #expect(assembler.received == stored)
        // The chunk that did not fit left no temporary file behind.
        let names = try FileManager.default.contentsOfDirectory(atPath: mount.path + "/up-7/chunks")
        #expect(!names.contains { $0.hasSuffix(".tmp") }, "\(names)")
        // Everything acknowledged before the disk filled is still there for the resume.
        let resumed = try UploadAssembler(resuming: mount.path + "/up-7", key: key)
        #expect(resumed.received == stored)
    }
}
