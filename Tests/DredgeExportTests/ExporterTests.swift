import Crypto
import DredgeDomain
import DredgePayload
import DredgeReception
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing
import ZIPFoundation
@testable import DredgeExport

@Suite struct ExporterTests {
    @Test func exportsExactlyTheFilteredRecordsAsPerDayFiles() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 20_000)
        let filter = LogFilter(since: Timestamp.now.subtracting(.seconds(2 * 86_400)), uid: "u-2", levels: [.warning, .error, .critical])
        let request = ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a01", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b01", commandID: "0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c01", filter: filter)
        let manifest = try Exporter.export(from: store, request, to: dir.file("export.zip"))

        let expected = try expectedDays(store, filter)
        #expect(manifest.days.map(\.file) == expected.keys.sorted())
        #expect(manifest.recordCount == (try store.count(matching: filter)))
        #expect(manifest.recordCount > 100)
        #expect(manifest.contexts.values.contains(exportContext))
        #expect(manifest.filter.uid == "u-2" && manifest.filter.levels == ["warning", "error", "critical"])

        let payload = try PayloadExtractor.extract(zip: dir.file("export.zip"), into: dir.file("out"))
        #expect(payload.manifest == manifest)
        #expect(payload.files.map { ($0 as NSString).lastPathComponent } == expected.keys.sorted())
        for file in payload.files {
            #expect(contents(file) == expected[(file as NSString).lastPathComponent], "\(file)")
        }
        // Every line is a JSON object with the documented fields.
        let line = contents(payload.files[0]).split(separator: "\n")[0]
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as! [String: Any]
        #expect(Set(object.keys) == ["ts", "level", "type", "uid", "message", "metadata", "context"])
    }

    @Test func anyUnzipToolOpensTheArchive() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 5_000)
        _ = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: .all), to: dir.file("export.zip"))
        // ZIPFoundation reads it and the CRCs check.
        let archive = try Archive(url: URL(fileURLWithPath: dir.file("export.zip")), accessMode: .read)
        var names: [String] = []
        for entry in archive {
            names.append(entry.path)
            _ = try archive.extract(entry, skipCRC32: false) { _ in }
        }
        #expect(names.last == "manifest.json")
        #expect(names.count == 5)  // 4 days (3 days back, partial at both ends) + manifest
    }

    @Test func anEmptySelectionIsASmallValidExportThatSaysItIsEmpty() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 100)
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: LogFilter(uid: "nobody")), to: dir.file("e.zip"))
        #expect(manifest.empty && manifest.recordCount == 0 && manifest.days.isEmpty)
        let size = try FileManager.default.attributesOfItem(atPath: dir.file("e.zip"))[.size] as! Int
        #expect(size < 2_000)
        let payload = try PayloadExtractor.extract(zip: dir.file("e.zip"), into: dir.file("out"))
        #expect(payload.files.isEmpty && payload.manifest.empty)
    }

    @Test func theManifestReportsWhatRetentionRemoved() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.retention.maxAge = .seconds(86_400)
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(exportContext)
        let now = Timestamp.now
        for i in 0..<48 {
            store.enqueue(LogEntry(timestamp: now.subtracting(.seconds(Int64(i) * 3_600)), level: .info, type: .app, uid: "u", message: "hour \(i)", context: ctx))
        }
        try store.flush()
        try store.runRetention()
        let manifest = try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: LogFilter(since: now.subtracting(.seconds(2 * 86_400)))), to: dir.file("e.zip"))
        #expect(manifest.recordCount == 24)
        #expect(manifest.losses.count == 1)
        #expect(manifest.losses[0].reason == "retention.age" && manifest.losses[0].count == 24)
    }

    @Test func parallelDeflateProducesOneValidStreamWhateverTheWorkers() throws {
        let dir = TempDir()
        var rng = SystemRandomNumberGenerator()
        // Text-like input across many blocks, with a tail that is not a block multiple.
        let words = ["timeout", "GET", "/api/v2/cart", "200", "503", "user", "checkout", "retry"]
        var text = ""
        while text.utf8.count < 3_300_000 { text += words[Int(rng.next() % 8)] + (rng.next() % 7 == 0 ? "\n" : " ") }
        let input = Array(text.utf8)
        var outputs: [[UInt8]] = []
        for workers in [1, 2, 4] {
            let path = dir.file("w\(workers).zip")
            let zip = try ZipWriter(path: path, level: 6, workers: workers, modified: Timestamp(microseconds: 1_795_340_400_000_000))
            try zip.beginEntry("2026-11-22.jsonl")
            // Written in uneven pieces.
            var offset = 0
            while offset < input.count {
                let n = min(Int(rng.next() % 200_000) + 1, input.count - offset)
                try zip.write(Array(input[offset..<offset + n]))
                offset += n
            }
            try zip.endEntry()
            _ = try zip.finish()
            let archive = try Archive(url: URL(fileURLWithPath: path), accessMode: .read)
            var out: [UInt8] = []
            _ = try archive.extract(archive["2026-11-22.jsonl"]!, skipCRC32: false) { out.append(contentsOf: $0) }
            #expect(out == input)
            outputs.append(Array(FileManager.default.contents(atPath: path)!))
        }
        // Deterministic: the bytes do not depend on the number of workers.
        #expect(outputs[0] == outputs[1] && outputs[1] == outputs[2])
    }
}

@Suite struct ExportFailureTests {
    @Test func aFailedExportLeavesNoPartialZip() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 1_000)
        try store.close()
        let zip = dir.file("export.zip")
        #expect(throws: (any Error).self) {
            try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: .all), to: zip)
        }
        #expect(!FileManager.default.fileExists(atPath: zip))
        let missing = #expect(throws: ExportError.self) {
            try SealedUpload(zipPath: dir.file("none.zip"), uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", key: .uploadKey(), empty: true, createdAt: 0)
        }
        #expect(missing?.code == .io)
    }

    @Test func anExportIntoADirectoryThatCannotBeWrittenFailsCleanly() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 100)
        let error = #expect(throws: ExportError.self) {
            try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: .all), to: "/proc/dredge-export.zip")
        }
        #expect(error?.code == .io)
    }

    @Test(.enabled(if: TmpfsMount.isSupported)) func aFullDiskFailsTheExportWithDiskFullAndLeavesNothing() throws {
        let dir = TempDir()
        let store = try makeStore(in: dir, count: 60_000)
        let mount = try TmpfsMount(megabytes: 1)
        defer { mount.remove() }
        let zip = mount.path + "/export.zip"
        let error = #expect(throws: ExportError.self) {
            try Exporter.export(from: store, ExportRequest(uploadID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", kind: .pull, agentID: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b00", commandID: "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a00", filter: .all), to: zip)
        }
        #expect(error?.code == .diskFull)
        #expect(!FileManager.default.fileExists(atPath: zip))
        // The store is untouched.
        #expect(try store.count(matching: .all) == 60_000)
    }
}

/// #49 (Protocol § 13, the exporter's zip): the DOS date holds 1980 to 2107; a year outside is
/// taken as the nearest, the month, day and time kept (the Python check's recipe does the same).
@Suite struct DOSTimeTests {

    @Test func yearsOutsideTheDOSRangeAreClampedKeepingTheRest() throws {
        func fields(_ at: String) throws -> [Int] {
            let (time, day) = ZipWriter.dosDateTime(try #require(Timestamp(rfc3339: at)))
            return [Int(day >> 9) + 1980, Int(day >> 5 & 0xF), Int(day & 0x1F), Int(time >> 11), Int(time >> 5 & 0x3F), Int(time & 0x1F) * 2]
        }
        #expect(try fields("2026-11-21T08:30:45.000000Z") == [2026, 11, 21, 8, 30, 44])
        #expect(try fields("1979-07-04T12:00:01.000000Z") == [1980, 7, 4, 12, 0, 0])
        #expect(try fields("1970-01-01T00:00:00.000000Z") == [1980, 1, 1, 0, 0, 0])
        #expect(try fields("2107-12-31T23:59:59.000000Z") == [2107, 12, 31, 23, 59, 58])
        #expect(try fields("2108-03-01T10:00:00.000000Z") == [2107, 3, 1, 10, 0, 0])
        #expect(try fields("9999-12-31T23:59:59.999999Z") == [2107, 12, 31, 23, 59, 58])
    }
}
