import DredgeDomain
import DredgePayload
import Foundation
import ZIPFoundation

/// A received export, unpacked and checked.
public struct ExtractedPayload: Sendable {
    public var manifest: ExportManifest
    /// Per-day files, in day order.
    public var files: [String]
    public var directory: String

    public init(manifest: ExportManifest, files: [String], directory: String) {
        self.manifest = manifest
        self.files = files
        self.directory = directory
    }
}

/// Unpacks an export zip on the receiving side with limits (README § Payload limits):
/// only the expected names, a bounded number of entries, a bounded total size and compression
/// ratio counted on the bytes actually inflated, CRCs checked; then the manifest is checked
/// against the files (names, record and byte counts, one JSON object per line). Anything wrong
/// is `ExportError(.payloadInvalid)` and leaves no partial files behind.
public enum PayloadExtractor {
    /// Unpacks into `directory`, which must not exist yet: a directory that already holds a
    /// result is never removed or replaced (`ExportError(.exists)`). The files are staged in
    /// `directory.partial`, checked, given the manifest (`manifest.json`, re-encoded), passed to
    /// `check` (which may refuse the manifest by throwing), and only then moved into place, so
    /// `directory` appears whole or not at all.
    public static func extract(
        zip zipPath: String, into directory: String, limits: PayloadLimits = PayloadLimits(), check: (ExportManifest) throws -> Void = { _ in }
    ) throws -> ExtractedPayload {
        let fm = FileManager.default
        guard !fm.fileExists(atPath: directory) else {
            throw ExportError(.exists, "\(directory) already holds a result; it is left as it is")
        }
        let staging = directory + ".partial"
        if fm.fileExists(atPath: staging) { try fm.removeItem(atPath: staging) }
        do {
            try fm.createDirectory(atPath: staging, withIntermediateDirectories: true)
            let payload = try extractChecked(zipPath: zipPath, staging: staging, limits: limits)
            try check(payload.manifest)
            return try PayloadStaging.publish(staging, manifest: payload.manifest, files: payload.files, to: directory)
        } catch {
            if fm.fileExists(atPath: staging) { try? fm.removeItem(atPath: staging) }  // our own partial files; the first error is the one to report
            if let error = error as? ExportError { throw error }
            // What is left are the receiver's own file operations failing (a full disk): not
            // the payload's fault, so not `.payloadInvalid`.
            throw fileError(error, "unpacking into \(directory)")
        }
    }

    private static func invalid(_ message: String) -> ExportError { ExportError(.payloadInvalid, message) }

    /// A failed write of our own: `.diskFull` when the disk is full, else `.io`.
    static func fileError(_ error: any Error, _ doing: String) -> ExportError {
        let ns = error as NSError
        let underlying = ns.userInfo[NSUnderlyingErrorKey] as? NSError
        let full = (ns.domain == NSPOSIXErrorDomain && ns.code == Int(ENOSPC)) || (underlying?.domain == NSPOSIXErrorDomain && underlying?.code == Int(ENOSPC))
            || (error as? CocoaError)?.code == .fileWriteOutOfSpace
        return ExportError(full ? .diskFull : .io, "\(doing): \(error)")
    }

    /// One entry of a zip's central directory as its records say, with where its data starts
    /// (after its own local header).
    struct DirectoryEntry {
        var name: String
        var method: UInt16
        var compressedSize: UInt64
        var uncompressedSize: UInt64
        var localOffset: UInt64
        /// Flag bit 0 in the central directory or in the local header.
        var encrypted: Bool
        /// The method the local header says (which is the one ZIPFoundation uses); nil, with
        /// `dataStart`, when the local header is not where the directory says.
        var localMethod: UInt16?
        var dataStart: UInt64?
    }

    /// The central directory read from the raw records, or nil when it cannot be read that way
    /// (ZIP64 end records, which ZIPFoundation would follow to another directory, included).
    static func directoryEntries(zipPath: String) -> [DirectoryEntry]? {
        guard let handle = FileHandle(forReadingAtPath: zipPath) else { return nil }
        defer { try? handle.close() }  // read only; nothing to lose
        guard let size = try? handle.seekToEnd(), size >= 22 else { return nil }
        let tailLength = min(size, 22 + 65_535)
        guard (try? handle.seek(toOffset: size - tailLength)) != nil, let tail = try? handle.read(upToCount: Int(tailLength)).map(Array.init) else { return nil }
        func u16(_ b: [UInt8], _ i: Int) -> Int { Int(b[i]) | Int(b[i + 1]) << 8 }
        func u32(_ b: [UInt8], _ i: Int) -> Int { u16(b, i) | u16(b, i + 2) << 16 }
        guard let end = stride(from: tail.count - 22, through: 0, by: -1).first(where: { tail[$0..<$0 + 4].elementsEqual([0x50, 0x4B, 0x05, 0x06]) }) else { return nil }
        if end >= 20, tail[end - 20..<end - 16].elementsEqual([0x50, 0x4B, 0x06, 0x07]) { return nil }  // a ZIP64 locator
        let (count, directorySize, directoryOffset) = (u16(tail, end + 10), u32(tail, end + 12), u32(tail, end + 16))
        // The directory ends where the end record starts, as in every zip without ZIP64 records.
        guard UInt64(directoryOffset) + UInt64(directorySize) == size - tailLength + UInt64(end), directorySize <= 64 << 20,
            (try? handle.seek(toOffset: UInt64(directoryOffset))) != nil,
            let directory = try? handle.read(upToCount: directorySize).map(Array.init), directory.count == directorySize
        else { return nil }
        var entries: [DirectoryEntry] = []
        var at = 0
        for _ in 0..<count {
            guard at + 46 <= directory.count, directory[at..<at + 4].elementsEqual([0x50, 0x4B, 0x01, 0x02]) else { return nil }
            let nameLength = u16(directory, at + 28)
            let next = at + 46 + nameLength + u16(directory, at + 30) + u16(directory, at + 32)
            guard next <= directory.count else { return nil }
            let localOffset = UInt64(u32(directory, at + 42))
            var entry = DirectoryEntry(
                name: String(decoding: directory[at + 46..<at + 46 + nameLength], as: UTF8.self), method: UInt16(u16(directory, at + 10)),
                compressedSize: UInt64(u32(directory, at + 20)), uncompressedSize: UInt64(u32(directory, at + 24)), localOffset: localOffset,
                encrypted: u16(directory, at + 8) & 1 != 0, localMethod: nil, dataStart: nil)
            if (try? handle.seek(toOffset: localOffset)) != nil, let local = try? handle.read(upToCount: 30).map(Array.init), local.count == 30,
                local[0..<4].elementsEqual([0x50, 0x4B, 0x03, 0x04])
            {
                // Marked in the central directory, or only in the entry's own local header.
                entry.encrypted = entry.encrypted || u16(local, 6) & 1 != 0
                entry.localMethod = UInt16(u16(local, 8))
                entry.dataStart = localOffset + 30 + UInt64(u16(local, 26)) + UInt64(u16(local, 28))
            }
            entries.append(entry)
            at = next
        }
        return entries
    }

    /// The names of the entries marked encrypted (flag bit 0) in the central directory or in
    /// their local header, which ZIPFoundation would list like any other and inflate into
    /// garbage. A directory that does not parse gives none here (the extraction refuses it).
    static func encryptedEntries(zipPath: String) -> [String] {
        (directoryEntries(zipPath: zipPath) ?? []).filter(\.encrypted).map(\.name)
    }

    /// Every deflated entry's stream ends within its compressed size: inflated here (the
    /// output counted against the ratio and total limits and dropped) before ZIPFoundation
    /// reads it. ZIPFoundation reads a deflated entry until its stream ends, past the entry's
    /// size, and spins for ever at the end of the file if it never does; a payload that could
    /// make it do that is refused first. So that this check and ZIPFoundation read the same
    /// entries the same way, the directory must read as the raw records say (no ZIP64, README
    /// § Payload), each entry's local header must be where it says, with the same method
    /// (stored or deflated), and no two entries may share one; the entry count is bounded
    /// before anything is inflated.
    static func checkDeflateStreams(_ entries: [DirectoryEntry], zipPath: String, limits: PayloadLimits) throws {
        guard entries.count <= limits.maxEntries else { throw invalid("more than \(limits.maxEntries) entries") }
        guard Set(entries.map(\.localOffset)).count == entries.count else { throw invalid("two entries share one local header") }
        guard let handle = FileHandle(forReadingAtPath: zipPath) else { throw ExportError(.io, "cannot open \(zipPath)") }
        defer { try? handle.close() }  // read only; nothing to lose
        var total: Int64 = 0
        for entry in entries {
            let name = entry.name.debugDescription
            guard entry.compressedSize != 0xFFFF_FFFF, entry.uncompressedSize != 0xFFFF_FFFF, entry.localOffset != 0xFFFF_FFFF else {
                throw invalid("entry \(name) has ZIP64 sizes: a payload never does")
            }
            guard let start = entry.dataStart, let localMethod = entry.localMethod else { throw invalid("entry \(name) has no local header where the directory says") }
            guard localMethod == entry.method else { throw invalid("entry \(name) says one compression method in its local header and another in the directory") }
            guard entry.method == 0 || entry.method == 8 else { throw invalid("entry \(name) uses compression method \(entry.method)") }
            guard entry.method == 8 else { continue }
            do { try handle.seek(toOffset: start) } catch { throw invalid("entry \(name) lies outside the zip") }
            try DeflateCheck.run(entry.name, compressedSize: Int64(entry.compressedSize), maxRatio: limits.maxCompressionRatio, total: &total, maxTotal: limits.maxTotalBytes) { count in
                do { return try handle.read(upToCount: count) ?? Data() } catch { throw ExportError(.io, "reading \(zipPath): \(error)") }
            }
        }
    }

    private static func extractChecked(zipPath: String, staging: String, limits: PayloadLimits) throws -> (manifest: ExportManifest, files: [String]) {
        // The raw records, read once: for the encryption flags ZIPFoundation ignores, then
        // for the streams it would read past their entries.
        guard let directory = directoryEntries(zipPath: zipPath) else { throw invalid("the zip's central directory cannot be read (or has ZIP64 records)") }
        if let encrypted = directory.first(where: \.encrypted) {
            throw invalid("entry \(encrypted.name.debugDescription) is encrypted: a payload's entries never are")
        }
        try checkDeflateStreams(directory, zipPath: zipPath, limits: limits)
        let archive: Archive
        do {
            archive = try Archive(url: URL(fileURLWithPath: zipPath), accessMode: .read)
        } catch {
            throw invalid("not a readable zip archive")
        }
        // Every name and kind is checked before anything is inflated.
        var names = Set<String>()
        var entries: [Entry] = []
        for entry in archive {
            try PayloadStaging.checkEntry(entry.path, isRegularFile: entry.type == .file, index: entries.count, limits: limits, names: &names)
            entries.append(entry)
        }
        guard names.contains(PayloadLimits.manifestName) else { throw invalid("no manifest.json") }

        let staged = PayloadStaging(directory: staging, limits: limits)
        defer { staged.abandon() }
        for entry in entries {
            // Declared by the zip (up to 2^64 − 1 in zip64): clamped, never trusted.
            try staged.begin(entry.path, isRegularFile: true, compressedSize: Int64(clamping: entry.compressedSize), checked: true)
            let crc: UInt32
            do {
                // ZIPFoundation computes the CRC of what it inflated but does not compare it:
                // that is ours to do (README § Payload: the receiver MUST check every entry's CRC).
                crc = try archive.extract(entry, skipCRC32: false) { data in
                    try data.withUnsafeBytes { try staged.write($0) }
                }
            } catch let error as ExportError {
                throw error
            } catch {
                throw invalid("\(entry.path) is damaged: \(error)")
            }
            try staged.end(crc: crc, declaredCRC: entry.checksum)
        }
        return try staged.finish()
    }
}
