import DredgeDomain
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
            try Data(try payload.manifest.encoded()).write(to: URL(fileURLWithPath: staging + "/" + PayloadLimits.manifestName))
            guard !fm.fileExists(atPath: directory) else {
                throw ExportError(.exists, "\(directory) already holds a result; it is left as it is")
            }
            try fm.moveItem(atPath: staging, toPath: directory)
            return ExtractedPayload(manifest: payload.manifest, files: payload.files.map { directory + "/" + $0 }, directory: directory)
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

    private static func extractChecked(zipPath: String, staging: String, limits: PayloadLimits) throws -> (manifest: ExportManifest, files: [String]) {
        let archive: Archive
        do {
            archive = try Archive(url: URL(fileURLWithPath: zipPath), accessMode: .read)
        } catch {
            throw invalid("not a readable zip archive")
        }
        var names = Set<String>()
        var entries: [Entry] = []
        for entry in archive {
            guard entries.count < limits.maxEntries else { throw invalid("more than \(limits.maxEntries) entries") }
            guard entry.type == .file else { throw invalid("entry \(entry.path.debugDescription) is not a regular file") }
            let name = entry.path
            guard PayloadLimits.isAllowedName(name) else { throw invalid("unexpected entry name \(name.debugDescription)") }
            guard names.insert(name).inserted else { throw invalid("duplicate entry \(name)") }
            entries.append(entry)
        }
        guard names.contains(PayloadLimits.manifestName) else { throw invalid("no manifest.json") }

        var total: Int64 = 0
        var manifestBytes: [UInt8] = []
        var dayFiles: [String: (bytes: Int, lines: Int)] = [:]
        for entry in entries {
            let name = entry.path
            let isManifest = name == PayloadLimits.manifestName
            // Declared by the zip (up to 2^64 − 1 in zip64): clamped, never trusted.
            let compressed = max(Int64(clamping: entry.compressedSize), 1)
            let ratioLimit = compressed.multipliedReportingOverflow(by: limits.maxCompressionRatio)
            let maxInflated = ratioLimit.overflow ? Int64.max : ratioLimit.partialValue
            var written: Int64 = 0
            var lines = 0, lastByte: UInt8 = 10
            let handle: FileHandle? = isManifest ? nil : try {
                let path = staging + "/" + name
                guard FileManager.default.createFile(atPath: path, contents: nil) else { throw ExportError(.io, "cannot create \(path)") }
                return try FileHandle(forWritingTo: URL(fileURLWithPath: path))
            }()
            do {
                // ZIPFoundation computes the CRC of what it inflated but does not compare it:
                // that is ours to do (README § Payload: the receiver MUST check every entry's CRC).
                let crc = try archive.extract(entry, skipCRC32: false) { data in
                    written += Int64(data.count)
                    total += Int64(data.count)
                    if total > limits.maxTotalBytes { throw invalid("payload inflates past \(limits.maxTotalBytes) bytes") }
                    if written > maxInflated && written > 1 << 20 {
                        throw invalid("\(name) inflates more than \(limits.maxCompressionRatio)× its compressed size")
                    }
                    if isManifest {
                        if written > limits.maxManifestBytes { throw invalid("manifest over \(limits.maxManifestBytes) bytes") }
                        manifestBytes.append(contentsOf: data)
                    } else {
                        lines += data.reduce(0) { $0 + ($1 == 10 ? 1 : 0) }
                        lastByte = data.last ?? lastByte
                        do { try handle?.write(contentsOf: data) } catch { throw fileError(error, "writing \(name)") }
                    }
                }
                guard crc == entry.checksum else {
                    throw invalid("\(name) does not match its CRC-32 (\(String(crc, radix: 16)) computed, \(String(entry.checksum, radix: 16)) in the zip)")
                }
            } catch let error as ExportError {
                throw error
            } catch {
                throw invalid("\(name) is damaged: \(error)")
            }
            if let handle {
                do {
                    try handle.synchronize()
                    try handle.close()
                } catch {
                    throw fileError(error, "writing \(name)")
                }
                guard lastByte == 10 else { throw invalid("\(name) does not end with a newline") }
                dayFiles[name] = (Int(written), lines)
            }
        }

        let manifest: ExportManifest
        do {
            manifest = try JSONDecoder().decode(ExportManifest.self, from: Data(manifestBytes))
        } catch {
            throw invalid("manifest.json is not a valid manifest: \(error)")
        }
        guard manifest.format == ExportManifest.formatName else { throw invalid("unknown format \(manifest.format.debugDescription)") }
        guard Set(manifest.days.map(\.file)) == Set(dayFiles.keys), manifest.days.count == dayFiles.count else {
            throw invalid("manifest lists \(manifest.days.map(\.file)) but the zip holds \(dayFiles.keys.sorted())")
        }
        for day in manifest.days {
            guard let actual = dayFiles[day.file] else { throw invalid("manifest lists \(day.file), which the zip does not hold") }
            guard day.records > 0 else { throw invalid("\(day.file) is listed with no records: a day without records has no file") }
            guard actual.bytes == day.bytes, actual.lines == day.records else {
                throw invalid("\(day.file): manifest says \(day.records) records in \(day.bytes) bytes, file has \(actual.lines) lines in \(actual.bytes) bytes")
            }
        }
        guard manifest.recordCount == manifest.days.reduce(0, { $0 + $1.records }), manifest.empty == (manifest.recordCount == 0) else {
            throw invalid("manifest record count does not add up")
        }
        return (manifest, manifest.days.map(\.file).sorted())
    }
}
