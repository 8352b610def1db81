@testable import DredgeExport
import DredgeDomain
@testable import DredgePayload
@testable import DredgeReception
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing
import ZIPFoundation

/// Zips an attacker could send: every one is refused with `.payloadInvalid` and leaves nothing
/// behind in the output directory.
@Suite struct HostilePayloadTests {
    func manifest(days: [ExportManifest.Day] = [], records: Int = 0) -> [UInt8] {
        try! ExportManifest(
            format: ExportManifest.formatName, uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: "pull", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", createdAt: "2026-11-21T00:00:00.000000Z",
            filter: .init(.all), recordCount: records, empty: records == 0, days: days, contexts: [:], losses: [], feedback: nil
        ).encoded()
    }

    func zip(_ dir: TempDir, _ entries: [(String, [UInt8])], level: Int32 = 6) throws -> String {
        let path = dir.file("hostile-\(UUID().uuidString).zip")
        let zip = try ZipWriter(path: path, level: level, workers: 2, modified: .now)
        for (name, bytes) in entries {
            try zip.beginEntry(name)
            try zip.write(bytes)
            try zip.endEntry()
        }
        _ = try zip.finish()
        return path
    }

    func expectRefused(_ path: String, _ dir: TempDir, limits: PayloadLimits = PayloadLimits(), _ comment: Comment) {
        let out = dir.file("out-\(UUID().uuidString)")
        let error = #expect(throws: ExportError.self, comment) { try PayloadExtractor.extract(zip: path, into: out, limits: limits) }
        #expect(error?.code == .payloadInvalid, comment)
        #expect(!FileManager.default.fileExists(atPath: out), comment)
        #expect(!FileManager.default.fileExists(atPath: out + ".partial"), comment)
    }

    @Test func namesOutsideTheExpectedSetAreRefused() throws {
        let dir = TempDir()
        let line = Array("{}\n".utf8)
        for name in ["../2026-11-20.jsonl", "/etc/passwd", "a/2026-11-20.jsonl", "2026-11-20.jsonl/", "..", "2026-13-45.jsonl", "2026-02-30.jsonl", "2026-04-31.jsonl", "2026-11-20.JSONL", "notes.txt", "2026-11-20.jsonl\u{0}x", "./manifest.json"] {
            let path = try zip(dir, [(name, line), ("manifest.json", manifest())])
            expectRefused(path, dir, "name \(name.debugDescription)")
            // Refused for its name, not only because the manifest does not list it.
            #expect(!PayloadLimits.isAllowedName(name), "\(name.debugDescription)")
        }
        for good in ["2026-11-20.jsonl", "2028-02-29.jsonl", "manifest.json"] { #expect(PayloadLimits.isAllowedName(good)) }
    }

    @Test func duplicatesMissingManifestAndTooManyEntriesAreRefused() throws {
        let dir = TempDir()
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: 3, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        expectRefused(try zip(dir, [("2026-11-20.jsonl", Array("{}\n".utf8)), ("2026-11-20.jsonl", Array("{}\n".utf8)), ("manifest.json", manifest(days: [day], records: 1))]), dir, "duplicate")
        expectRefused(try zip(dir, [("2026-11-20.jsonl", Array("{}\n".utf8))]), dir, "no manifest")
        var limits = PayloadLimits()
        limits.maxEntries = 3
        let many = (1...4).map { (String(format: "2026-11-%02d.jsonl", $0), Array("{}\n".utf8)) } + [("manifest.json", manifest())]
        expectRefused(try zip(dir, many), dir, limits: limits, "too many entries")
    }

    @Test func zipBombsAndOversizePayloadsAreStoppedWhileInflating() throws {
        try MemoryHeavy.run { try zipBombs() }
    }

    func zipBombs() throws {
        let dir = TempDir()
        let zeros = [UInt8](repeating: 0x30, count: 40 * 1_048_576)  // 40 MiB of one byte: ~1000× compression
        let bomb = try zip(dir, [("2026-11-20.jsonl", zeros), ("manifest.json", manifest())], level: 9)
        let bombSize = try FileManager.default.attributesOfItem(atPath: bomb)[.size] as! Int
        #expect(bombSize < 200_000)
        expectRefused(bomb, dir, "compression ratio")
        var limits = PayloadLimits()
        limits.maxTotalBytes = 1_048_576
        limits.maxCompressionRatio = 100_000
        expectRefused(bomb, dir, limits: limits, "total size")
        limits = PayloadLimits()
        limits.maxManifestBytes = 10
        expectRefused(try zip(dir, [("manifest.json", manifest())]), dir, limits: limits, "manifest size")
    }

    @Test func aManifestThatDisagreesWithTheFilesIsRefused() throws {
        let dir = TempDir()
        let file = Array("{\"a\":1}\n{\"a\":2}\n".utf8)
        let right = ExportManifest.Day(file: "2026-11-20.jsonl", records: 2, bytes: file.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        #expect(throws: Never.self) { try PayloadExtractor.extract(zip: try zip(dir, [("2026-11-20.jsonl", file), ("manifest.json", manifest(days: [right], records: 2))]), into: dir.file("ok")) }
        var wrongCount = right
        wrongCount.records = 3
        expectRefused(try zip(dir, [("2026-11-20.jsonl", file), ("manifest.json", manifest(days: [wrongCount], records: 3))]), dir, "record count")
        var other = right
        other.file = "2026-11-21.jsonl"
        expectRefused(try zip(dir, [("2026-11-20.jsonl", file), ("manifest.json", manifest(days: [other], records: 2))]), dir, "file list")
        expectRefused(try zip(dir, [("2026-11-20.jsonl", Array("{}".utf8)), ("manifest.json", manifest(days: [right], records: 2))]), dir, "no final newline")
        expectRefused(try zip(dir, [("manifest.json", Array("{\"format\":\"x\"}".utf8))]), dir, "bad manifest")
        expectRefused(try zip(dir, [("manifest.json", Array("not json".utf8))]), dir, "not json")
    }

    @Test func damagedAndNonZipFilesAreRefused() throws {
        let dir = TempDir()
        let good = try zip(dir, [("2026-11-20.jsonl", Array(String(repeating: "{\"k\":\"value\"}\n", count: 5_000).utf8)), ("manifest.json", manifest())])
        var bytes = Array(FileManager.default.contents(atPath: good)!)
        bytes[200] ^= 0xFF  // inside the deflated data: CRC or inflate fails
        let damaged = dir.file("damaged.zip")
        FileManager.default.createFile(atPath: damaged, contents: Data(bytes))
        expectRefused(damaged, dir, "damaged data")
        let truncated = dir.file("truncated.zip")
        FileManager.default.createFile(atPath: truncated, contents: Data(bytes.prefix(bytes.count / 2)))
        expectRefused(truncated, dir, "truncated")
        let text = dir.file("text.zip")
        FileManager.default.createFile(atPath: text, contents: Data("hello".utf8))
        expectRefused(text, dir, "not a zip")
        expectRefused(dir.file("missing.zip"), dir, "missing file")
    }

    @Test func symlinkEntriesAreRefused() throws {
        let dir = TempDir()
        let path = dir.file("symlink.zip")
        let archive = try Archive(url: URL(fileURLWithPath: path), accessMode: .create)
        let target = Data("/etc/passwd".utf8)
        try archive.addEntry(with: "2026-11-20.jsonl", type: .symlink, uncompressedSize: Int64(target.count), provider: { (_: Int64, _: Int) in target })
        expectRefused(path, dir, "symlink")
    }
}

/// Every entry's CRC-32 is checked (README § Payload): changed bytes under the original CRC, or
/// a changed CRC over the original bytes, are refused.
@Suite struct PayloadCRCTests {
    let base = HostilePayloadTests()

    func storedZip(_ dir: TempDir) throws -> (path: String, bytes: [UInt8]) {
        let line = Array(#"{"a":1}"#.utf8) + [10]
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 1, bytes: line.count, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        let path = try base.zip(dir, [("2026-11-20.jsonl", line), ("manifest.json", base.manifest(days: [day], records: 1))], level: 0)
        return (path, Array(FileManager.default.contents(atPath: path)!))
    }

    @Test func theUnchangedZipIsAccepted() throws {
        let dir = TempDir()
        #expect(throws: Never.self) { try PayloadExtractor.extract(zip: try storedZip(dir).path, into: dir.file("ok")) }
    }

    @Test func changedBytesUnderTheOriginalCRCAreRefused() throws {
        let dir = TempDir()
        var (path, bytes) = try storedZip(dir)
        let needle = Array(#"{"a":1}"#.utf8)
        let at = try #require((0...(bytes.count - needle.count)).first { Array(bytes[$0..<$0 + needle.count]) == needle })
        bytes[at + 5] = UInt8(ascii: "2")
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        base.expectRefused(path, dir, "changed byte")
        _ = path
    }

    @Test func aWrongCRCIsRefused() throws {
        let dir = TempDir()
        var (path, bytes) = try storedZip(dir)
        // The first entry's CRC wherever the zip records it: local header (+14), data
        // descriptor (+4), central directory (+16).
        func flip(after signature: [UInt8], offset: Int) {
            if let at = (0...(bytes.count - 4)).first(where: { Array(bytes[$0..<$0 + 4]) == signature }) { bytes[at + offset] ^= 0x5A }
        }
        flip(after: [0x50, 0x4B, 0x03, 0x04], offset: 14)
        flip(after: [0x50, 0x4B, 0x07, 0x08], offset: 4)
        flip(after: [0x50, 0x4B, 0x01, 0x02], offset: 16)
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        base.expectRefused(path, dir, "wrong CRC")
        _ = path
    }
}

extension PayloadCRCTests {
    /// An entry marked encrypted (general purpose flag bit 0) is refused for that reason, by the
    /// whole-zip reader and by the stream, rather than inflated into garbage or reported as a
    /// zip with no manifest.
    @Test func anEncryptedEntryIsRefusedAsSuch() throws {
        let dir = TempDir()
        var (path, bytes) = try storedZip(dir)
        // The flags of every entry: local headers (+6) and the central directory (+8).
        for at in 0...(bytes.count - 4) {
            if bytes[at..<at + 4].elementsEqual([0x50, 0x4B, 0x03, 0x04]) { bytes[at + 6] |= 1 }
            if bytes[at..<at + 4].elementsEqual([0x50, 0x4B, 0x01, 0x02]) { bytes[at + 8] |= 1 }
        }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        #expect(PayloadExtractor.encryptedEntries(zipPath: path) == ["2026-11-20.jsonl", "manifest.json"])
        base.expectRefused(path, dir, "encrypted")
        let error = #expect(throws: ExportError.self) { try PayloadExtractor.extract(zip: path, into: dir.file("x")) }
        #expect(error?.message.contains("encrypted") == true, "\(String(describing: error))")
        #expect(PayloadExtractor.encryptedEntries(zipPath: try storedZip(TempDir()).path) == [])
    }

    /// Marked only in an entry's local header (the central directory says nothing): still
    /// refused, by the whole-zip reader too (the stream refuses it and hands over to it).
    @Test func anEntryMarkedEncryptedOnlyInItsLocalHeaderIsRefused() throws {
        let dir = TempDir()
        var (path, bytes) = try storedZip(dir)
        let at = try #require((0...(bytes.count - 4)).first { bytes[$0..<$0 + 4].elementsEqual([0x50, 0x4B, 0x03, 0x04]) })
        bytes[at + 6] |= 1
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        #expect(PayloadExtractor.encryptedEntries(zipPath: path) == ["2026-11-20.jsonl"])
        base.expectRefused(path, dir, "encrypted in the local header only")
    }

    /// A day listed with no records (its file empty) breaks § Payload: a day without records
    /// has no file.
    @Test func anEmptyDayFileIsRefused() throws {
        let dir = TempDir()
        let day = ExportManifest.Day(file: "2026-11-20.jsonl", records: 0, bytes: 0, first: "2026-11-20T10:00:00.000000Z", last: "2026-11-20T10:00:01.000000Z")
        base.expectRefused(try base.zip(dir, [("2026-11-20.jsonl", []), ("manifest.json", base.manifest(days: [day], records: 0))]), dir, "empty day")
    }
}
