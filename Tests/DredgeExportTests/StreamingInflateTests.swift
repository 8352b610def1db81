@testable import DredgeExport
import DredgeDomain
@testable import DredgePayload
@testable import DredgeReception
import DredgeTestSupport
import Foundation
import Testing
import ZIPFoundation

/// The streaming reader's inflate of a deflated entry with declared sizes (igzip where the
/// package is built with it, as the server is), held to the declared sizes and the CRC
/// whatever the piece sizes: a stream that ends early, runs over, or has any byte damaged is
/// refused, as the whole-zip reader refuses it.
@Suite struct StreamingInflateTests {
    let hostile = HostilePayloadTests()

    struct Entry {
        var name: String
        var method: UInt16
        var crc: UInt32
        var size: Int
        var data: [UInt8]
        var declared: Int
        /// The method the central directory says, when it differs from the local header's.
        var centralMethod: UInt16? = nil
    }

    /// A zip laid out as the agent lays it out (sizes in the local headers, no descriptors).
    func rawZip(_ dir: TempDir, _ entries: [Entry]) -> String {
        func le16(_ v: Int, _ out: inout [UInt8]) { out += [UInt8(v & 0xFF), UInt8(v >> 8 & 0xFF)] }
        func le32(_ v: UInt32, _ out: inout [UInt8]) { for s in [0, 8, 16, 24] { out.append(UInt8(v >> UInt32(s) & 0xFF)) } }
        var zip: [UInt8] = [], central: [UInt8] = []
        for e in entries {
            let offset = zip.count, name = Array(e.name.utf8)
            le32(0x0403_4B50, &zip); le16(20, &zip); le16(0x0800, &zip); le16(Int(e.method), &zip); le16(0, &zip); le16(0x21, &zip)
            le32(e.crc, &zip); le32(UInt32(e.declared), &zip); le32(UInt32(e.size), &zip); le16(name.count, &zip); le16(0, &zip)
            zip += name + e.data
            le32(0x0201_4B50, &central); le16(0x031E, &central); le16(20, &central); le16(0x0800, &central); le16(Int(e.centralMethod ?? e.method), &central)
            le16(0, &central); le16(0x21, &central); le32(e.crc, &central); le32(UInt32(e.declared), &central); le32(UInt32(e.size), &central)
            le16(name.count, &central); le16(0, &central); le16(0, &central); le16(0, &central); le16(0, &central)
            le32(UInt32(0o100644) << 16, &central); le32(UInt32(offset), &central)
            central += name
        }
        let start = zip.count
        zip += central
        le32(0x0605_4B50, &zip); le16(0, &zip); le16(0, &zip); le16(entries.count, &zip); le16(entries.count, &zip)
        le32(UInt32(central.count), &zip); le32(UInt32(start), &zip); le16(0, &zip)
        let path = dir.file("raw-\(UUID().uuidString).zip")
        FileManager.default.createFile(atPath: path, contents: Data(zip))
        return path
    }

    /// A day of lines that deflate well, then random base64, then raw random bytes (which
    /// deflate leaves in stored blocks): every kind of block igzip decodes.
    func dayContent(lines: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        var text = ""
        for i in 0..<lines { text += #"{"ts":"2026-11-20T10:00:00.000000Z","level":"info","message":"request \#(i % 97) handled"}"# + "\n" }
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var bytes = Array(text.utf8)
        for _ in 0..<(lines / 4) { bytes += (0..<100).map { _ in alphabet.randomElement(using: &generator)! } + [10] }
        for _ in 0..<(lines / 8) { bytes += (0..<300).map { _ in UInt8.random(in: 11...255, using: &generator) } + [10] }
        return bytes
    }

    /// The day entry deflated by the agent's writer (its CRC, data and sizes), and a manifest
    /// entry, stored, that agrees with it.
    func parts(_ dir: TempDir, _ content: [UInt8]) throws -> (day: Entry, manifest: Entry) {
        let name = "2026-11-20.jsonl"
        let written = Array(try Data(contentsOf: URL(fileURLWithPath: try hostile.zip(dir, [(name, content)]))))
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(written[at + $1]) << (8 * UInt32($1)) } }
        let compressed = Int(u32(18)), nameLength = Int(written[26]) | Int(written[27]) << 8, extra = Int(written[28]) | Int(written[29]) << 8
        let dataStart = 30 + nameLength + extra
        let day = Entry(name: name, method: 8, crc: u32(14), size: content.count, data: Array(written[dataStart..<dataStart + compressed]), declared: compressed)
        let lines = content.filter { $0 == 10 }.count
        let manifestBytes = hostile.manifest(
            days: [ExportManifest.Day(file: name, records: lines, bytes: content.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")],
            records: lines)
        let manifestCRC = Data(manifestBytes).crc32(checksum: 0)
        let manifest = Entry(name: "manifest.json", method: 0, crc: manifestCRC, size: manifestBytes.count, data: manifestBytes, declared: manifestBytes.count)
        return (day, manifest)
    }

    @Test func anEntryIsInflatedWholeInAnyPieceSize() throws {
        let dir = TempDir()
        let content = dayContent(lines: 3_000)
        let (day, manifest) = try parts(dir, content)
        let zip = rawZip(dir, [day, manifest])
        for piece in [1, 5, 8, 9, 4_093, 1 << 20] {
            let out = dir.file("out-\(piece)")
            let result = try streamUnpack(zip, into: out, piece: piece)
            #expect(result.files.count == 1)
            #expect(result.files.first.flatMap { FileManager.default.contents(atPath: $0) } == Data(content), "piece \(piece)")
        }
    }

    @Test func aDeflateStreamMustEndWithinItsDeclaredSizeAndWhatFollowsIsSkipped() throws {
        let dir = TempDir()
        let content = dayContent(lines: 2_000)
        let (day, manifest) = try parts(dir, content)
        // Bytes after the stream inside the declared size (fewer than igzip gives back, and
        // more): skipped by both readers, as unzip tools skip them.
        for padding in [3, 40] {
            var padded = day
            padded.data += [UInt8](repeating: 0x5A, count: padding)
            padded.declared += padding
            let zip = rawZip(dir, [padded, manifest])
            for piece in [1, 7, 64 << 10] {
                let result = try streamUnpack(zip, into: dir.file("padded-\(padding)-\(piece)"), piece: piece)
                #expect(result.files.first.flatMap { FileManager.default.contents(atPath: $0) } == Data(content), "padding \(padding), piece \(piece)")
            }
            let whole = try PayloadExtractor.extract(zip: zip, into: dir.file("whole-padded-\(padding)"))
            #expect(whole.files.first.flatMap { FileManager.default.contents(atPath: $0) } == Data(content))
        }
        // A declared size that cuts the stream: it does not end within it. Both readers refuse
        // it (the whole-zip reader used to spin for ever on such an entry at the end of the zip).
        var cut = day
        cut.data.removeLast(3)
        cut.declared -= 3
        let zip = rawZip(dir, [cut, manifest])
        for piece in [1, 7, 64 << 10] {
            let out = dir.file("out-\(piece)")
            let error = #expect(throws: ExportError.self, "piece \(piece)") { try streamUnpack(zip, into: out, piece: piece) }
            #expect(error?.code == .payloadInvalid, "piece \(piece)")
            #expect(error?.message.contains("does not end within") == true, "\(String(describing: error))")
            #expect(!FileManager.default.fileExists(atPath: out))
        }
        let error = #expect(throws: ExportError.self) { try PayloadExtractor.extract(zip: zip, into: dir.file("whole-cut")) }
        #expect(error?.code == .payloadInvalid)
        #expect(!FileManager.default.fileExists(atPath: dir.file("whole-cut")))
    }

    /// A deflate stream that never ends: a stored block, not the last, announcing 65,535 bytes
    /// where the zip has a few. ZIPFoundation alone reads past the entry and spins for ever at
    /// the end of the file (a hostile agent could have held an unpacking thread with one upload).
    func neverEnding(_ manifest: Entry) -> Entry {
        let data: [UInt8] = [0x00, 0xFF, 0xFF, 0x00, 0x00] + Array("{\"a\":1}\n".utf8)
        return Entry(name: "2026-11-20.jsonl", method: 8, crc: 0, size: 1_000, data: data, declared: data.count)
    }

    @Test(.timeLimit(.minutes(1))) func theWholeZipReaderRefusesAStreamThatNeverEnds() throws {
        let dir = TempDir()
        let (_, manifest) = try parts(dir, dayContent(lines: 10))
        let zip = rawZip(dir, [manifest, neverEnding(manifest)])
        let error = #expect(throws: ExportError.self) { try PayloadExtractor.extract(zip: zip, into: dir.file("out")) }
        #expect(error?.code == .payloadInvalid)
        #expect(error?.message.contains("does not end within") == true, "\(String(describing: error))")
        #expect(!FileManager.default.fileExists(atPath: dir.file("out")))
        let streamed = #expect(throws: ExportError.self) { try streamUnpack(zip, into: dir.file("streamed")) }
        #expect(streamed?.message.contains("does not end within") == true, "\(String(describing: streamed))")
    }

    /// Where this check and ZIPFoundation could read an entry differently, the zip is refused:
    /// a local header that says deflated under a directory that says stored (ZIPFoundation
    /// goes by the local header), and ZIP64 end records (which it would follow elsewhere).
    @Test(.timeLimit(.minutes(1))) func entriesTheTwoReadersCouldReadDifferentlyAreRefused() throws {
        let dir = TempDir()
        let (day, manifest) = try parts(dir, dayContent(lines: 10))
        var mislabelled = neverEnding(manifest)
        mislabelled.centralMethod = 0
        let zip = rawZip(dir, [manifest, mislabelled])
        let error = #expect(throws: ExportError.self) { try PayloadExtractor.extract(zip: zip, into: dir.file("out")) }
        #expect(error?.code == .payloadInvalid)
        #expect(error?.message.contains("compression method") == true, "\(String(describing: error))")

        var bytes = Array(FileManager.default.contents(atPath: rawZip(dir, [day, manifest]))!)
        let end = bytes.count - 22
        bytes.insert(contentsOf: [0x50, 0x4B, 0x06, 0x07] + [UInt8](repeating: 0, count: 16), at: end)
        let zip64 = dir.file("zip64.zip")
        FileManager.default.createFile(atPath: zip64, contents: Data(bytes))
        let refused = #expect(throws: ExportError.self) { try PayloadExtractor.extract(zip: zip64, into: dir.file("out64")) }
        #expect(refused?.code == .payloadInvalid)
        #expect(!FileManager.default.fileExists(atPath: dir.file("out64")))
    }

    #if canImport(CDredgeISAL)
    /// The server's build inflates with igzip: the same bytes and CRC-32 as were deflated.
    @Test func igzipInflatesWhatTheAgentsWriterDeflated() throws {
        let dir = TempDir()
        let content = dayContent(lines: 1_500)
        let (day, _) = try parts(dir, content)
        let inflater = IgzipInflater()
        var input = day.data, output = [UInt8](repeating: 0, count: 4_096), inflated: [UInt8] = []
        let step = try input.withUnsafeMutableBytes { raw in
            try inflater.inflate(raw.baseAddress!.assumingMemoryBound(to: UInt8.self), count: raw.count, into: &output) { piece, _ in
                inflated += piece
            } damaged: { status in ExportError(.payloadInvalid, "inflate says \(status)") }
        }
        #expect(step.ended)
        #expect(inflated == content)
        #expect(inflater.crc == day.crc)
    }
    #endif

    @Test func everyDamagedByteOfADeflatedEntryIsRefusedWhileStreaming() throws {
        let dir = TempDir()
        let (day, manifest) = try parts(dir, dayContent(lines: 400))
        let stride = max(1, day.data.count / 150)
        for at in Swift.stride(from: 0, to: day.data.count, by: stride) {
            var damaged = day
            damaged.data[at] ^= 0x55
            let zip = rawZip(dir, [damaged, manifest])
            let out = dir.file("out-\(at)")
            let error = #expect(throws: ExportError.self) { try streamUnpack(zip, into: out, piece: 1_000) }
            #expect(error?.code == .payloadInvalid, "byte \(at) of \(day.data.count)")
            #expect(!FileManager.default.fileExists(atPath: out))
            try? FileManager.default.removeItem(atPath: zip)  // the test's own scratch file
        }
    }
}
