import Crypto
import DredgeDomain
import DredgeEnvelope
@testable import DredgePayload
@testable import DredgeReception
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Synchronization
import Testing
import ZIPFoundation
@testable import DredgeExport

/// The executor a stream's work runs on in these tests: another thread, as the server's pool.
let testUnpacking: PayloadStream.Schedule = { work in DispatchQueue.global().async { work(true) } }

/// Streams the zip at `path` through a ``PayloadStream`` in pieces of `piece` bytes and
/// publishes it into `out`; throws what the stream refused.
@discardableResult
func streamUnpack(_ path: String, into out: String, limits: PayloadLimits = PayloadLimits(), piece: Int = 7_777) throws -> ExtractedPayload {
    let bytes = Array(FileManager.default.contents(atPath: path) ?? Data())
    let stream = try PayloadStream(staging: out + ".stream", zipPath: out + ".zip", limits: limits, schedule: testUnpacking)
    var at = 0
    while at < bytes.count {
        stream.append(Data(bytes[at..<min(bytes.count, at + piece)]))
        at += piece
    }
    do {
        return try stream.finish(into: out) { _ in }
    } catch {
        stream.discard()
        throw error
    }
}

/// A pull of `count` records exported to `export.zip` in `dir` and sealed in chunks of
/// `chunkSize`, as an agent sends it.
struct ExportedPull {
    let store: LogStore
    let zip: String
    let manifest: ExportManifest
    let key: SymmetricKey
    let upload: SealedUpload

    init(_ dir: TempDir, count: Int = 8_000, id: String, agent: String, chunkSize: Int) throws {
        store = try makeStore(in: dir, count: count)
        zip = dir.file("export.zip")
        manifest = try Exporter.export(from: store, ExportRequest(uploadID: id, kind: .pull, agentID: agent, commandID: id, filter: .all), to: zip)
        key = SymmetricKey.uploadKey()
        upload = try SealedUpload(
            zipPath: zip, uploadID: id, kind: .pull, agentID: agent, key: key, empty: manifest.empty, createdAt: Timestamp.now.microseconds, chunkSize: chunkSize)
    }

    /// Checks that `payload` holds this pull's manifest and day files, and that the zip at
    /// `zipPath` is the exported one byte for byte.
    func expectLanded(_ payload: ExtractedPayload, zipAt zipPath: String) throws {
        #expect(payload.manifest == manifest)
        let expected = try expectedDays(store, .all)
        for file in payload.files { #expect(contents(file) == expected[(file as NSString).lastPathComponent]) }
        let same = FileManager.default.contents(atPath: zipPath) == FileManager.default.contents(atPath: zip)
        #expect(same, "the zip kept beside the files is the exported one")
    }
}

/// An executor that holds a stream's work until ``release()``: what a stream does before its
/// worker runs shows.
final class HeldWork: @unchecked Sendable {  // `work` under `lock`
    private let lock = NSLock()
    private var work: [@Sendable (Bool) -> Void] = []

    var schedule: PayloadStream.Schedule { { work in self.lock.withLock { self.work.append(work) } } }

    /// Runs what was held, each on another thread, as the server's pool would.
    func release() {
        let held = lock.withLock {
            defer { work = [] }
            return work
        }
        for work in held { DispatchQueue.global().async { work(true) } }
    }
}

/// The files this process has open (Linux: `/proc/self/fd`).
func openFiles() -> Set<String> {
    let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return Set(fds.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0) })
}

/// Unpacking while an upload arrives gives exactly what unpacking the finished zip gives, and
/// refuses every hostile zip the finished-zip path refuses.
@Suite struct StreamingUnpackTests {
    let hostile = HostilePayloadTests()

    /// The vectorized newline count against a byte-by-byte one: every byte value (10 and its
    /// neighbours, 0x8A with the high bit set, 0) at every alignment and tail length, and long
    /// runs of newlines.
    @Test func newlinesAreCountedExactly() {
        var generator = SystemRandomNumberGenerator()
        let alphabet: [UInt8] = [10, 11, 9, 0x8A, 0x0A | 0x80, 0, 0xFF, 0x7F, 65]
        for length in 0..<80 {
            for _ in 0..<20 {
                let bytes = (0..<length).map { _ in alphabet.randomElement(using: &generator)! }
                for start in 0..<min(8, length + 1) {
                    let part = bytes[start...]
                    let counted = part.withUnsafeBytes { PayloadStaging.newlines(in: $0) }
                    #expect(counted == part.filter { $0 == 10 }.count, "\(Array(part))")
                }
            }
        }
        let all = (0..<4096).map { UInt8(truncatingIfNeeded: $0) }
        #expect(all.withUnsafeBytes { PayloadStaging.newlines(in: $0) } == 16)
        // Long runs of newlines: a lane counts at most 255 before the lanes are added up, so a
        // count that wrapped would come out short.
        for length in [32 * 255, 32 * 255 + 1, 32 * 256, 100_003] {
            let lines = [UInt8](repeating: 10, count: length)
            #expect(lines.withUnsafeBytes { PayloadStaging.newlines(in: $0) } == length)
        }
    }

    @Test func aStreamedExportEqualsTheExtractedOneInAnyPieceSize() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 6_000)
        let zip = dir.file("export.zip")
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a01", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b01", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a01", filter: .all), to: zip)
        let extracted = try PayloadExtractor.extract(zip: zip, into: dir.file("extracted"))
        for piece in [1, 29, 4_096, 1 << 20] {
            let out = dir.file("streamed-\(piece)")
            let streamed = try streamUnpack(zip, into: out, piece: piece)
            #expect(streamed.manifest == manifest)
            #expect(streamed.files.map { ($0 as NSString).lastPathComponent } == extracted.files.map { ($0 as NSString).lastPathComponent })
            for (a, b) in Swift.zip(streamed.files, extracted.files) { #expect(FileManager.default.contents(atPath: a) == FileManager.default.contents(atPath: b)) }
            // The zip the stream kept is the zip it was given, whole.
            #expect(FileManager.default.contents(atPath: out + ".zip") == FileManager.default.contents(atPath: zip))
            #expect(!FileManager.default.fileExists(atPath: out + ".stream"), "the staging directory became the result")
        }
    }

    @Test func storedEntriesAndDataDescriptorsAreReadFrontToBack() throws {
        let dir = TempDir()
        let line = Array(#"{"a":1}"#.utf8) + [10]
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 3, bytes: line.count * 3, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        let entries = [("2026-11-20.jsonl", line + line + line), ("manifest.json", hostile.manifest(days: [day], records: 3))]
        // Stored (level 0) from our writer; deflated with data descriptors from ZIPFoundation.
        let stored = try hostile.zip(dir, entries, level: 0)
        #expect(try streamUnpack(stored, into: dir.file("stored")).manifest.recordCount == 3)
        let other = dir.file("zipfoundation.zip")
        let archive = try Archive(url: URL(fileURLWithPath: other), accessMode: .create)
        for (name, bytes) in entries {
            try archive.addEntry(with: name, type: .file, uncompressedSize: Int64(bytes.count), compressionMethod: .deflate) { (position: Int64, size: Int) in
                Data(bytes[Int(position)..<Int(position) + size])
            }
        }
        let out = try streamUnpack(other, into: dir.file("deflated"))
        #expect(out.manifest.recordCount == 3)
        #expect(FileManager.default.contents(atPath: out.files[0]) == Data(line + line + line))
    }

    /// Each hostile zip of ``HostilePayloadTests``, streamed, is refused as an invalid payload
    /// and publishes nothing.
    func expectStreamRefused(_ path: String, _ dir: TempDir, limits: PayloadLimits = PayloadLimits(), _ comment: Comment) {
        let out = dir.file("stream-out-\(UUID().uuidString)")
        let error = #expect(throws: ExportError.self, comment) { try streamUnpack(path, into: out, limits: limits) }
        #expect(error?.code == .payloadInvalid, comment)
        #expect(!FileManager.default.fileExists(atPath: out), comment)
        #expect(!FileManager.default.fileExists(atPath: out + ".stream"), comment)
    }

    @Test func hostileZipsAreRefusedWhileStreaming() throws {
        let dir = TempDir()
        let line = Array("{}\n".utf8)
        for name in ["../2026-11-20.jsonl", "/etc/passwd", "a/2026-11-20.jsonl", "2026-11-20.jsonl/", "2026-13-45.jsonl", "notes.txt", "./manifest.json"] {
            expectStreamRefused(try hostile.zip(dir, [(name, line), ("manifest.json", hostile.manifest())]), dir, "name \(name.debugDescription)")
        }
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: 3, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        expectStreamRefused(try hostile.zip(dir, [("2026-11-20.jsonl", line), ("2026-11-20.jsonl", line), ("manifest.json", hostile.manifest(days: [day], records: 1))]), dir, "duplicate")
        expectStreamRefused(try hostile.zip(dir, [("2026-11-20.jsonl", line)]), dir, "no manifest")
        var few = PayloadLimits()
        few.maxEntries = 3
        let many = (1...4).map { (String(format: "2026-11-%02d.jsonl", $0), line) } + [("manifest.json", hostile.manifest())]
        expectStreamRefused(try hostile.zip(dir, many), dir, limits: few, "too many entries")

        let bomb = try MemoryHeavy.run { try hostile.zip(dir, [("2026-11-20.jsonl", [UInt8](repeating: 0x30, count: 8 << 20)), ("manifest.json", hostile.manifest())], level: 9) }
        expectStreamRefused(bomb, dir, "compression ratio")
        var small = PayloadLimits()
        small.maxTotalBytes = 1 << 20
        small.maxCompressionRatio = 100_000
        expectStreamRefused(bomb, dir, limits: small, "total size")

        let file = Array("{\"a\":1}\n{\"a\":2}\n".utf8)
        var wrong = ExportManifest.Day(file: "2026-11-20.jsonl", records: 3, bytes: file.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        expectStreamRefused(try hostile.zip(dir, [("2026-11-20.jsonl", file), ("manifest.json", hostile.manifest(days: [wrong], records: 3))]), dir, "record count")
        wrong.records = 2
        expectStreamRefused(try hostile.zip(dir, [("2026-11-20.jsonl", Array("{}".utf8)), ("manifest.json", hostile.manifest(days: [wrong], records: 2))]), dir, "no final newline")
        expectStreamRefused(try hostile.zip(dir, [("manifest.json", Array("not json".utf8))]), dir, "not json")
    }

    @Test func damagedTruncatedAndMislabelledZipsAreRefusedWhileStreaming() throws {
        let dir = TempDir()
        let good = try hostile.zip(dir, [("2026-11-20.jsonl", Array(String(repeating: "{\"k\":\"value\"}\n", count: 5_000).utf8)), ("manifest.json", hostile.manifest())])
        var bytes = Array(FileManager.default.contents(atPath: good)!)
        bytes[200] ^= 0xFF
        let damaged = dir.file("damaged.zip")
        FileManager.default.createFile(atPath: damaged, contents: Data(bytes))
        expectStreamRefused(damaged, dir, "damaged data")
        let truncated = dir.file("truncated.zip")
        FileManager.default.createFile(atPath: truncated, contents: Data(bytes.prefix(bytes.count / 2)))
        expectStreamRefused(truncated, dir, "truncated")

        // A CRC changed in the central directory only: the directory no longer describes the entry.
        let line = Array(#"{"a":1}"#.utf8) + [10]
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: line.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        let stored = try hostile.zip(dir, [("2026-11-20.jsonl", line), ("manifest.json", hostile.manifest(days: [day], records: 1))], level: 0)
        var central = Array(FileManager.default.contents(atPath: stored)!)
        let at = try #require((0...(central.count - 4)).first { Array(central[$0..<$0 + 4]) == [0x50, 0x4B, 0x01, 0x02] })
        central[at + 16] ^= 0x5A
        let mislabelled = dir.file("central.zip")
        FileManager.default.createFile(atPath: mislabelled, contents: Data(central))
        expectStreamRefused(mislabelled, dir, "central directory CRC")
        // Bytes after the end record.
        let trailing = dir.file("trailing.zip")
        FileManager.default.createFile(atPath: trailing, contents: Data(Array(FileManager.default.contents(atPath: stored)!) + [0]))
        expectStreamRefused(trailing, dir, "trailing bytes")
    }

    @Test func symlinkEntriesAreRefusedWhileStreaming() throws {
        let dir = TempDir()
        let path = dir.file("symlink.zip")
        let archive = try Archive(url: URL(fileURLWithPath: path), accessMode: .create)
        let target = Data("/etc/passwd".utf8)
        try archive.addEntry(with: "2026-11-20.jsonl", type: .symlink, uncompressedSize: Int64(target.count), provider: { (_: Int64, _: Int) in target })
        try archive.addEntry(with: "manifest.json", type: .file, uncompressedSize: Int64(hostile.manifest().count)) { (_: Int64, _: Int) in Data(hostile.manifest()) }
        expectStreamRefused(path, dir, "symlink")
    }

    /// What it does not read front to back is said to be unreadable, not invalid: the receiver
    /// then unpacks the finished zip, which decides.
    @Test func aZipWithBytesBeforeItsFirstEntryIsLeftToTheWholeZipReader() throws {
        let dir = TempDir()
        let line = Array(#"{"a":1}"#.utf8) + [10]
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: line.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        let stored = try hostile.zip(dir, [("2026-11-20.jsonl", line), ("manifest.json", hostile.manifest(days: [day], records: 1))])
        let text = dir.file("text.zip")
        FileManager.default.createFile(atPath: text, contents: Data("hello".utf8 + Array(FileManager.default.contents(atPath: stored)!)))
        #expect(throws: ZipStreamReader.Unreadable.self) { try streamUnpack(text, into: dir.file("out")) }
        #expect(!FileManager.default.fileExists(atPath: dir.file("out")))
    }

    /// The receiver's side: chunks accepted in any order are handed to the stream in order, so
    /// the files are published from the stream without assembling the zip again.
    @Test func anAssemblerStreamsChunksInOrderWhateverOrderTheyArriveIn() throws {
        let dir = TempDir()
        let pull = try ExportedPull(dir, id: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a07", agent: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b07", chunkSize: 16 * 1024)
        let (upload, key) = (pull.upload, pull.key)
        let path = dir.file("incoming/up-7")
        // Half the chunks before a restart; the rest after, in reverse, with re-sends.
        do {
            let first = try UploadAssembler(directory: path, header: upload.header, key: key)
            first.stream(into: try PayloadStream(staging: path + "/s1", zipPath: path + "/s1.zip", schedule: testUnpacking))
            for index in stride(from: 0, to: upload.header.chunkCount, by: 2) { try first.accept(index: index, ciphertext: try upload.chunk(index)) }
            #expect(!first.streamedEverything)
            first.stream?.discard()
        }
        let assembler = try UploadAssembler(resuming: path, key: key)
        assembler.stream(into: try PayloadStream(staging: path + "/s2", zipPath: path + "/s2.zip", schedule: testUnpacking))
        for index in Array(0..<upload.header.chunkCount).reversed() + [0, 1] { try assembler.accept(index: index, ciphertext: try upload.chunk(index)) }
        assembler.catchUp()  // what the receiver does after the last chunk
        #expect(assembler.streamedEverything)
        let payload = try #require(assembler.stream).finish(into: dir.file("files")) { _ in }
        try pull.expectLanded(payload, zipAt: path + "/s2.zip")
        #expect(!FileManager.default.fileExists(atPath: path + "/s1"), "a discarded stream leaves nothing")
    }

    /// A resumed upload streams too, without reading its held chunks back before the agent may
    /// go on: the stream catches up a few chunks with each one that arrives, and the rest after
    /// the last; the files are the stream's, byte for byte what was exported.
    @Test func aResumedUploadCatchesUpWhileTheRestArrives() throws {
        let dir = TempDir()
        let pull = try ExportedPull(dir, id: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a08", agent: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b08", chunkSize: 8 * 1024)
        let (upload, key) = (pull.upload, pull.key)
        let count = upload.header.chunkCount
        let path = dir.file("incoming/up-8")
        let held = count * 3 / 4
        #expect(held > 2 * UploadAssembler.catchUpPerCommit + 2)
        do {
            let first = try UploadAssembler(directory: path, header: upload.header, key: key)
            for index in 0..<held { try first.accept(index: index, ciphertext: try upload.chunk(index)) }
        }
        let assembler = try UploadAssembler(resuming: path, key: key)
        assembler.stream(into: try PayloadStream(staging: path + "/s", zipPath: path + "/s.zip", schedule: testUnpacking))
        #expect(assembler.streamed == 0, "nothing is read back before the next chunk")
        try assembler.accept(index: held, ciphertext: try upload.chunk(held))
        #expect(assembler.streamed == UInt32(UploadAssembler.catchUpPerCommit), "a few held chunks with each that arrives")
        try assembler.accept(index: held, ciphertext: try upload.chunk(held))
        #expect(assembler.streamed == UInt32(UploadAssembler.catchUpPerCommit), "a chunk sent again commits nothing")
        for index in (held + 1)..<count { try assembler.accept(index: index, ciphertext: try upload.chunk(index)) }
        #expect(assembler.streamed == UInt32(UploadAssembler.catchUpPerCommit) * (count - held), "still behind after the last chunk")
        #expect(!assembler.streamedEverything)
        assembler.catchUp()
        #expect(assembler.streamedEverything)
        let payload = try #require(assembler.stream).finish(into: dir.file("files")) { _ in }
        try pull.expectLanded(payload, zipAt: path + "/s.zip")
    }
}

extension StreamingUnpackTests {
    /// The receiver writes several chunks at once, on pool threads, and commits them in order:
    /// the files and the zip kept beside them are the exported ones byte for byte.
    @Test func chunksWrittenAtOnceFromSeveralThreadsMakeTheWholeZip() throws {
        let dir = TempDir()
        let pull = try ExportedPull(dir, id: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a09", agent: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b09", chunkSize: 8 * 1024)
        let (upload, key) = (pull.upload, pull.key)
        let count = Int(upload.header.chunkCount)
        #expect(count > 16)
        let path = dir.file("incoming/up-9")
        let assembler = try UploadAssembler(directory: path, header: upload.header, key: key)
        assembler.stream(into: try PayloadStream(staging: path + "/s", zipPath: path + "/s.zip", schedule: testUnpacking))
        nonisolated(unsafe) let writer = assembler  // `write` reads only what never changes
        let sealed = try (0..<count).map { try upload.chunk(UInt32($0)) }
        // Eight at a time, as the server's connection does, committed in order after each batch.
        for batch in stride(from: 0, to: count, by: 8) {
            let indices = Array(batch..<min(count, batch + 8))
            let plaintexts = Mutex([Int: Result<Data, any Error>]())
            DispatchQueue.concurrentPerform(iterations: indices.count) { i in
                let index = indices[indices.count - 1 - i]
                let outcome = Result { try writer.write(index: UInt32(index), ciphertext: Data(sealed[index])) }
                plaintexts.withLock { $0[index] = outcome }
            }
            for index in indices { assembler.commit(index: UInt32(index), plaintext: try #require(plaintexts.withLock { $0[index] }).get()) }
        }
        #expect(assembler.streamedEverything)
        let payload = try #require(assembler.stream).finish(into: dir.file("files")) { _ in }
        try pull.expectLanded(payload, zipAt: path + "/s.zip")
    }

    /// The stream's zip cannot be written (its disk is full): the stream stops, which is not the
    /// chunks' failure. Every chunk is still verified, stored and held, and the whole zip
    /// reassembled from them (what the receiver does when streaming stopped) is the exported one.
    @Test(.enabled(if: TmpfsMount.isSupported)) func aZipThatCannotBeWrittenStopsTheStreamNotTheChunks() throws {
        let dir = TempDir()
        let pull = try ExportedPull(dir, count: 48_000, id: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a", agent: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0a", chunkSize: 64 * 1024)
        let (upload, key) = (pull.upload, pull.key)
        #expect(upload.header.plaintextSize > 1_200_000, "more than the 1 MiB disk the zip is written to")
        let mount = try TmpfsMount(megabytes: 1)
        defer { mount.remove() }
        let path = dir.file("incoming/up-10")
        let assembler = try UploadAssembler(directory: path, header: upload.header, key: key)
        assembler.stream(into: try PayloadStream(staging: path + "/s", zipPath: mount.path + "/s.zip", schedule: testUnpacking))
        for index in 0..<upload.header.chunkCount { try assembler.accept(index: index, ciphertext: try upload.chunk(index)) }
        #expect(assembler.isComplete)
        let stream = try #require(assembler.stream)
        #expect((stream.failure as? ExportError)?.code == .diskFull)
        #expect(!assembler.streamedEverything)
        #expect(throws: ExportError.self) { try stream.finish(into: dir.file("files")) { _ in } }
        stream.discard()
        try assembler.assemble(to: dir.file("whole.zip"))
        let same = FileManager.default.contents(atPath: dir.file("whole.zip")) == FileManager.default.contents(atPath: pull.zip)
        #expect(same)
    }

    /// The zip is written by whoever appends, when it appends (the receiver's committing
    /// thread), not by the stream's worker, which only inflates: with the worker held back,
    /// the zip is already whole. (Pieces of 64 KiB or more, which the buffered writer hands
    /// to the kernel at once.)
    @Test func theZipIsWrittenWhenItsBytesAreAppendedNotWhenTheyAreInflated() throws {
        let dir = TempDir()
        let pull = try ExportedPull(dir, id: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0b", agent: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", chunkSize: 64 * 1024)
        let bytes = try #require(FileManager.default.contents(atPath: pull.zip))
        let size = (bytes.count + 3) / 4
        try #require(bytes.count - 3 * size >= 64 << 10 && bytes.count < PayloadStream.maxPendingBytes, "\(bytes.count) bytes")
        let held = HeldWork()
        let stream = try PayloadStream(staging: dir.file("s"), zipPath: dir.file("s.zip"), schedule: held.schedule)
        for i in 0..<4 { stream.append(bytes.subdata(in: (i * size)..<min(bytes.count, (i + 1) * size))) }
        let written = try FileManager.default.attributesOfItem(atPath: dir.file("s.zip"))[.size] as? Int
        #expect(written == bytes.count, "the zip is written before anything is inflated")
        held.release()
        let payload = try stream.finish(into: dir.file("files")) { _ in }
        try pull.expectLanded(payload, zipAt: dir.file("s.zip"))
    }

    /// A zip that cannot be written (a full disk) stops the stream at the append that failed,
    /// not later in the worker; the append itself returns (the chunk is not refused for it).
    /// Discarding the stream lets go of the zip's file at once.
    @Test(.enabled(if: TmpfsMount.isSupported)) func aZipThatCannotBeWrittenStopsTheStreamAtOnce() throws {
        let mount = try TmpfsMount(megabytes: 1)
        defer { mount.remove() }
        let dir = TempDir()
        let held = HeldWork()
        let zipPath = mount.path + "/s.zip"
        let stream = try PayloadStream(staging: dir.file("s"), zipPath: zipPath, schedule: held.schedule)
        let piece = Data(repeating: 0x41, count: 256 << 10)
        for _ in 0..<6 { stream.append(piece) }  // 1.5 MiB for a 1 MiB disk, the worker held back
        #expect((stream.failure as? ExportError)?.code == .diskFull)
        held.release()
        #expect(throws: ExportError.self) { try stream.finish(into: dir.file("files")) { _ in } }
        stream.discard()
        // While the stream is still referenced (by the receiver's assembler, say).
        withExtendedLifetime(stream) {
            // (A removed file still open shows as "PATH (deleted)".)
            #expect(!openFiles().contains { $0.hasPrefix(zipPath) }, "the zip is closed once the stream is discarded")
        }
    }

    /// A pool that has stopped answers at once on the caller's thread: the stream fails with a
    /// reason instead of hanging the thread that feeds it.
    @Test func aStoppedPoolFailsTheStreamInsteadOfHangingIt() throws {
        let dir = TempDir()
        let stream = try PayloadStream(staging: dir.file("staging"), zipPath: dir.file("s.zip"), schedule: { work in work(false) })
        stream.append(Data([0x50, 0x4B, 0x03, 0x04]))
        stream.append(Data([0x00]))
        #expect(stream.failure != nil)
        #expect(throws: ExportError.self) { try stream.finish(into: dir.file("out")) { _ in } }
        #expect(!FileManager.default.fileExists(atPath: dir.file("out")))
    }
}

extension StreamingUnpackTests {
    func bytes(of path: String) -> [UInt8] { Array(FileManager.default.contents(atPath: path) ?? Data()) }
    func offset(of signature: [UInt8], in b: [UInt8], last: Bool = false) -> Int? {
        let all = (0...(b.count - 4)).filter { Array(b[$0..<$0 + 4]) == signature }
        return last ? all.last : all.first
    }

    /// A deflated entry that declares no compressed bytes cannot keep the reader waiting (and
    /// holding every byte that follows in memory): it is refused as soon as its header is read.
    @Test func aDeflatedEntryOfNoBytesIsRefusedAtItsHeader() throws {
        let dir = TempDir()
        let path = try hostile.zip(dir, [("2026-11-20.jsonl", Array(String(repeating: "{\"k\":1}\n", count: 1_000).utf8)), ("manifest.json", hostile.manifest())])
        var b = bytes(of: path)
        for i in 18..<22 { b[i] = 0 }  // the first local header's compressed size
        let stream = try PayloadStream(staging: dir.file("staging"), zipPath: dir.file("s.zip"), schedule: testUnpacking)
        stream.append(Data(b))
        let error = #expect(throws: ExportError.self) { try stream.finish(into: dir.file("out")) { _ in } }
        #expect(error?.code == .payloadInvalid)
        #expect(error?.message.contains("no bytes") == true, "\(String(describing: error))")
    }

    /// Where a whole-zip reader could read the zip differently (an end record hidden in a
    /// comment, central flags that differ from the local ones), the stream does not decide.
    @Test func commentsAndDifferingFlagsAreNotDecidedByTheStream() throws {
        let dir = TempDir()
        let line = Array(#"{"a":1}"#.utf8) + [10]
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: line.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        let path = try hostile.zip(dir, [("2026-11-20.jsonl", line), ("manifest.json", hostile.manifest(days: [day], records: 1))])
        #expect(throws: Never.self) { try streamUnpack(path, into: dir.file("plain")) }

        var commented = bytes(of: path)
        let end = try #require(offset(of: [0x50, 0x4B, 0x05, 0x06], in: commented, last: true))
        commented[end + 20] = 3
        commented += Array("abc".utf8)
        let withComment = dir.file("comment.zip")
        FileManager.default.createFile(atPath: withComment, contents: Data(commented))
        #expect(throws: ZipStreamReader.Unreadable.self) { try streamUnpack(withComment, into: dir.file("c")) }

        var flagged = bytes(of: path)
        let central = try #require(offset(of: [0x50, 0x4B, 0x01, 0x02], in: flagged))
        flagged[central + 8] |= 0x08  // "a data descriptor follows", which none does
        let withFlags = dir.file("flags.zip")
        FileManager.default.createFile(atPath: withFlags, contents: Data(flagged))
        expectStreamRefused(withFlags, dir, "central flags differ")
    }
}
