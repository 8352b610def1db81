import DredgeDomain
import DredgePayload
import DredgeStore
import DredgeWire
import Foundation

/// What to export and for whom.
public struct ExportRequest: Sendable {
    public enum Kind: String, Sendable { case pull, feedback, export, capture }

    public var uploadID: String
    public var kind: Kind
    public var agentID: String
    public var commandID: String?
    public var filter: LogFilter
    public var feedback: ExportManifest.FeedbackDescription?
    /// What fired a capture (kind `capture`, Protocol § 21).
    public var capture: ExportManifest.CaptureDescription?
    public var createdAt: Timestamp

    public init(
        uploadID: String, kind: Kind, agentID: String, commandID: String? = nil, filter: LogFilter,
        feedback: ExportManifest.FeedbackDescription? = nil, capture: ExportManifest.CaptureDescription? = nil, createdAt: Timestamp = .now
    ) {
        self.capture = capture
        self.uploadID = uploadID
        self.kind = kind
        self.agentID = agentID
        self.commandID = commandID
        self.filter = filter
        self.feedback = feedback
        self.createdAt = createdAt
    }
}

public struct ExportOptions: Sendable {
    /// zlib level. 6 is zlib's default; see docs/export.md for the measured trade-off.
    public var compressionLevel: Int32 = 6
    /// Threads compressing in parallel. Default: the active processor count.
    public var workers = ProcessInfo.processInfo.activeProcessorCount
    public init() {}
}

/// Turns stored logs into the export zip (README § Payload): one `YYYY-MM-DD.jsonl` per UTC day
/// that has records, oldest first, then `manifest.json`.
///
/// Streaming: records are read off the store's index one at a time and written as JSON lines
/// straight from SQLite's buffers into a 256 KiB buffer handed to the parallel deflater; memory is bounded by the buffers and
/// the blocks in flight, never by the size of the export. The zip is written to `zipPath`
/// (fsynced) and nothing else touches the disk.
public enum Exporter {
    /// On failure the partial zip is removed.
    public static func export(
        from store: LogStore, _ request: ExportRequest, to zipPath: String, options: ExportOptions = ExportOptions()
    ) throws -> ExportManifest {
        do {
            return try write(from: store, request, to: zipPath, options: options)
        } catch {
            unlink(zipPath)
            if let error = error as? ExportError { throw error }
            if let error = error as? StoreError { throw error }
            throw ExportError(.io, "\(error)")
        }
    }

    private static func write(
        from store: LogStore, _ request: ExportRequest, to zipPath: String, options: ExportOptions
    ) throws -> ExportManifest {
        let zip = try ZipWriter(path: zipPath, level: options.compressionLevel, workers: options.workers, modified: request.createdAt)
        var days: [ExportManifest.Day] = []
        var contextIDs = Set<ContextID>()
        var currentDay: Int64?
        var lastContext: ContextID?
        var line = JSONWriter(reservingCapacity: 300 * 1024)
        var dayRecords = 0, dayBytes = 0, total = 0
        var first = Timestamp(microseconds: 0), last = Timestamp(microseconds: 0)

        func closeDay() throws {
            guard currentDay != nil else { return }
            try zip.write(line.bytes)
            dayBytes += line.bytes.count
            line.reset()
            try zip.endEntry()
            days.append(ExportManifest.Day(file: first.utcDay + ".jsonl", records: dayRecords, bytes: dayBytes, first: first.rfc3339, last: last.rfc3339))
        }

        try store.forEachJSONLine(matching: request.filter) { timestamp, context, bytes in
            let day = timestamp.epochDay
            if day != currentDay {
                try closeDay()
                currentDay = day
                dayRecords = 0
                dayBytes = 0
                first = timestamp
                try zip.beginEntry(timestamp.utcDay + ".jsonl")
            }
            line.writeRawBytes(bytes.assumingMemoryBound(to: UInt8.self))
            dayRecords += 1
            total += 1
            last = timestamp
            if context != lastContext {
                contextIDs.insert(context)
                lastContext = context
            }
            if line.bytes.count >= 256 * 1024 {
                try zip.write(line.bytes)
                dayBytes += line.bytes.count
                line.reset()
            }
        }
        try closeDay()

        let contexts = try store.contexts(contextIDs)
        let losses = try store.losses(since: request.filter.since, until: request.filter.until).map {
            ExportManifest.Loss(reason: $0.reason.rawValue, count: $0.count, first: $0.first.rfc3339, last: $0.last.rfc3339, recordedAt: $0.recordedAt.rfc3339)
        }
        let manifest = ExportManifest(
            format: ExportManifest.formatName, uploadID: request.uploadID, kind: request.kind.rawValue,
            commandID: request.commandID, agentID: request.agentID, createdAt: request.createdAt.rfc3339,
            filter: .init(request.filter), recordCount: total, empty: total == 0, days: days,
            contexts: Dictionary(uniqueKeysWithValues: contexts.map { (String($0.key.rawValue), $0.value) }),
            losses: losses, feedback: request.feedback, capture: request.capture)
        try zip.beginEntry(PayloadLimits.manifestName)
        try zip.write(try manifest.encoded())
        try zip.endEntry()
        _ = try zip.finish()
        return manifest
    }
}
