import DredgePayload
import DredgeTestSupport
import Foundation
import Testing

/// The buffered writer every zip and unpacked day file goes through: what reaches the disk is
/// exactly what was written and patched, across buffer flushes and write-behind requests.
@Suite struct BufferedFileTests {
    @Test func writesAndPatchesSurviveFlushesAndWriteBehind() throws {
        let dir = TempDir()
        let path = dir.file("out.bin")
        let file = try BufferedFile(creating: path)
        var expected: [UInt8] = []
        // Odd sizes through both entry points, past several 1 MiB flushes and several
        // write-behind strides.
        let total = Int(BufferedFile.writeBehindBytes) * 2 + 3 * 65_537
        var piece = 1
        while expected.count < total {
            let start = expected.count
            let bytes = (0..<piece).map { UInt8(truncatingIfNeeded: ((start + $0) &* 2_654_435_761) >> 13) }
            if piece % 2 == 0 {
                try file.write(bytes)
            } else {
                try bytes.withUnsafeBytes { try file.write($0) }
            }
            expected += bytes
            piece = piece * 3 % 300_007 + 1
        }
        #expect(file.offset == UInt64(expected.count))
        let header: [UInt8] = [0xDE, 0xAD, 0xBE, 0xEF]
        try file.patch(header, at: 5)
        expected.replaceSubrange(5..<9, with: header)
        try file.close()
        let written = try #require(FileManager.default.contents(atPath: path))
        #expect(written.count == expected.count)
        // Not `==` inside #expect: on a mismatch it would diff megabytes element by element.
        let same = written.elementsEqual(expected)
        #expect(same)
    }
}

/// The one durable-write helper: what lands is exactly what was given, however it is held and
/// however many `write(2)` calls it takes, and a write that fails leaves the old content.
@Suite struct DurableFileTests {
    /// Patterned bytes, so a piece written twice or at the wrong place shows.
    static func pattern(_ count: Int, seed: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: (($0 + seed) &* 2_654_435_761) >> 11) }
    }

    /// Whether `path` holds exactly `bytes` (a Bool, so a mismatch is not diffed byte by byte).
    static func holds(_ path: String, _ bytes: some Sequence<UInt8>) throws -> Bool {
        try #require(FileManager.default.contents(atPath: path)).elementsEqual(bytes)
    }

    @Test func aWriteOfManyPiecesLandsWhole() throws {
        let dir = TempDir()
        let path = dir.file("chunk")
        // Several calls' worth and an odd tail, from an array and from `Data` (the server's
        // chunks arrive as `Data`), each replacing the last.
        let large = Self.pattern(DurableFile.maxWriteBytes * 4 + 4_099, seed: 1)
        try DurableFile.write(large, to: path)
        #expect(try Self.holds(path, large))
        let data = Data(Self.pattern(DurableFile.maxWriteBytes * 2 + 17, seed: 2))
        try DurableFile.write(data, to: path)
        #expect(try Self.holds(path, data))
        // A slice of `Data` (not starting at index 0) and a collection that is not contiguous.
        let slice = data.dropFirst(5)
        try DurableFile.write(slice, to: path)
        #expect(try Self.holds(path, slice))
        let strided = Self.pattern(DurableFile.maxWriteBytes + 3, seed: 3).reversed()
        try DurableFile.write(strided, to: path)
        #expect(try Self.holds(path, strided))
        #expect(!FileManager.default.fileExists(atPath: path + ".tmp"))
    }

    @Test func aWriteThatCannotStartLeavesTheOldContent() throws {
        let dir = TempDir()
        let path = dir.file("state")
        try DurableFile.write([1, 2, 3], to: path)
        // The temporary name is taken by a directory: the file cannot be created.
        try FileManager.default.createDirectory(atPath: path + ".tmp", withIntermediateDirectories: false)
        let error = #expect(throws: ExportError.self) { try DurableFile.write(Self.pattern(100_000, seed: 4), to: path) }
        #expect(error?.code == .io)
        #expect(try Self.holds(path, [1, 2, 3]))
    }
}
