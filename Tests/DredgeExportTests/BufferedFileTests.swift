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
        #expect(Array(written) == expected)
    }
}
