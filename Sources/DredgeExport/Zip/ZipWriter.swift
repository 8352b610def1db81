import DredgeDomain
import DredgePayload
import Foundation

/// Writes a standard zip file (PKWARE APPNOTE 6.3: local headers, deflated data, central
/// directory) that any unzip tool opens. Entries are deflated in parallel
/// (``ParallelDeflater``) and streamed to the file; each local header is patched with the CRC
/// and sizes once the entry is done, so there are no data descriptors and the output depends
/// only on the input, the level and the timestamp (it is reproducible).
///
/// Limits: no ZIP64; an entry, and the whole archive, must stay under 4 GiB.
final class ZipWriter {
    private struct CentralEntry {
        var name: [UInt8]
        var crc: UInt32
        var compressed: UInt32
        var uncompressed: UInt32
        var offset: UInt32
    }

    private let file: BufferedFile
    private let level: Int32
    private let workers: Int
    private let dosTime: UInt16
    private let dosDate: UInt16
    private var entries: [CentralEntry] = []
    private var currentName: [UInt8]?
    private var currentOffset: UInt64 = 0
    private var deflater: ParallelDeflater?

    init(path: String, level: Int32, workers: Int, modified: Timestamp) throws {
        file = try BufferedFile(creating: path)
        self.level = level
        self.workers = workers
        (dosTime, dosDate) = Self.dosDateTime(modified)
    }

    func beginEntry(_ name: String) throws {
        precondition(currentName == nil, "entry already open")
        let nameBytes = Array(name.utf8)
        currentName = nameBytes
        currentOffset = file.offset
        var header: [UInt8] = []
        header.le32(0x0403_4B50)
        header.le16(20)  // version needed: 2.0 (deflate)
        header.le16(0x0800)  // general purpose flags: UTF-8 names
        header.le16(8)  // deflate
        header.le16(dosTime)
        header.le16(dosDate)
        header.le32(0)  // CRC-32, patched in endEntry
        header.le32(0)  // compressed size, patched
        header.le32(0)  // uncompressed size, patched
        header.le16(UInt16(nameBytes.count))
        header.le16(0)  // extra field length
        header.append(contentsOf: nameBytes)
        try file.write(header)
        let file = self.file
        deflater = ParallelDeflater(level: level, workers: workers) { try file.write($0) }
    }

    func write(_ bytes: UnsafeRawBufferPointer) throws { try deflater!.write(bytes) }
    func write(_ bytes: [UInt8]) throws { try deflater!.write(bytes) }

    func endEntry() throws {
        guard let name = currentName, let deflater else { preconditionFailure("no entry open") }
        let summary = try deflater.finish()
        self.deflater = nil
        currentName = nil
        guard summary.compressedSize < UInt32.max, summary.uncompressedSize < UInt32.max, file.offset < UInt32.max else {
            throw ZipError("entry \(String(decoding: name, as: UTF8.self)) is over the 4 GiB zip limit")
        }
        var patch: [UInt8] = []
        patch.le32(summary.crc32)
        patch.le32(UInt32(summary.compressedSize))
        patch.le32(UInt32(summary.uncompressedSize))
        try file.patch(patch, at: currentOffset + 14)
        entries.append(CentralEntry(name: name, crc: summary.crc32, compressed: UInt32(summary.compressedSize), uncompressed: UInt32(summary.uncompressedSize), offset: UInt32(currentOffset)))
    }

    /// Writes the central directory and closes the file; returns the archive's size.
    func finish() throws -> UInt64 {
        precondition(currentName == nil, "entry still open")
        let start = file.offset
        for e in entries {
            var c: [UInt8] = []
            c.le32(0x0201_4B50)
            c.le16(0x0314)  // made by: UNIX, 2.0
            c.le16(20)
            c.le16(0x0800)
            c.le16(8)
            c.le16(dosTime)
            c.le16(dosDate)
            c.le32(e.crc)
            c.le32(e.compressed)
            c.le32(e.uncompressed)
            c.le16(UInt16(e.name.count))
            c.le16(0)  // extra
            c.le16(0)  // comment
            c.le16(0)  // disk number
            c.le16(0)  // internal attributes
            c.le32(0o100644 << 16)  // external attributes: regular file, rw-r--r--
            c.le32(e.offset)
            c.append(contentsOf: e.name)
            try file.write(c)
        }
        let size = file.offset - start
        guard entries.count < 0xFFFF, file.offset < UInt32.max else { throw ZipError("archive over the zip limits (no ZIP64)") }
        var end: [UInt8] = []
        end.le32(0x0605_4B50)
        end.le16(0)
        end.le16(0)
        end.le16(UInt16(entries.count))
        end.le16(UInt16(entries.count))
        end.le32(UInt32(size))
        end.le32(UInt32(start))
        end.le16(0)
        try file.write(end)
        try file.close()
        return file.offset
    }

    /// MS-DOS time and date (local to the zip, we use UTC), 2-second resolution: the
    /// timestamp's whole seconds (rounded down, in integers: a `Date` would round
    /// 23:59:59.999999 up into the next day).
    static func dosDateTime(_ at: Timestamp) -> (UInt16, UInt16) {
        let micros = at.microseconds
        var seconds = time_t(micros / 1_000_000 - (micros % 1_000_000 < 0 ? 1 : 0))
        var t = tm()
        gmtime_r(&seconds, &t)
        // The DOS date holds 1980 to 2107 (Protocol § 13): month, day and time are kept.
        let year = min(2107, max(1980, Int(t.tm_year) + 1900))
        let time = UInt16(t.tm_hour) << 11 | UInt16(t.tm_min) << 5 | UInt16(t.tm_sec / 2)
        let day = UInt16(year - 1980) << 9 | UInt16(t.tm_mon + 1) << 5 | UInt16(t.tm_mday)
        return (time, day)
    }
}

extension Array where Element == UInt8 {
    mutating func le16(_ v: UInt16) { append(UInt8(v & 0xFF)); append(UInt8(v >> 8)) }
    mutating func le32(_ v: UInt32) { for i in 0..<4 { append(UInt8((v >> (8 * UInt32(i))) & 0xFF)) } }
}
