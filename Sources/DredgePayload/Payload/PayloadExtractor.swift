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

    private static func extractChecked(zipPath: String, staging: String, limits: PayloadLimits) throws -> (manifest: ExportManifest, files: [String]) {
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
