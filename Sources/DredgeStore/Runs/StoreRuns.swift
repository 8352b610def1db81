import DredgeDomain
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A run of an app process over the store (#54): marked as started when its ``LogCenter``
/// opens, and as ended cleanly when it closes. A run whose process is gone without closing it
/// (a crash, a kill, the OOM killer, the machine restarting) is found by the next process that
/// looks (the app's next run, the agent) and marked as ended uncleanly, its rewind buffer frozen
/// into the store first: what a crash capture uploads.
public struct StoreRun: Sendable, Hashable {
    public enum End: String, Sendable {
        /// Its center closed.
        case clean
        /// Its process was gone without closing it.
        case unclean
    }

    /// 32 lowercase hex characters.
    public var id: String
    public var context: ContextID
    public var pid: Int32
    public var startedAt: Timestamp
    /// When it ended: its close, or (unclean) its last record, else when it was found gone.
    public var endedAt: Timestamp?
    public var end: End?
    /// The rewind buffer's file (a name beside the store, in ``LogStore/rewindDirectory``) while
    /// it may hold records not yet frozen.
    public var rewind: String?
    /// Records frozen from its rewind buffer when it ended uncleanly.
    public var rewound: Int
}

extension LogStore {
    /// Where the store's processes keep their rewind buffers: `<store>-rewind/`, one file a run.
    public var rewindDirectory: String { path + "-rewind" }

    /// Marks a run of this process as started; with `keepsRewind`, its rewind buffer is the file
    /// named ``StoreRun/rewind`` in ``rewindDirectory`` (the caller makes it).
    public func beginRun(context: ContextID, keepsRewind: Bool, now: Timestamp = .now) throws -> StoreRun {
        let id = Self.newRunID()
        let rewind = keepsRewind ? id : nil
        let run = StoreRun(id: id, context: context, pid: getpid(), startedAt: now, endedAt: nil, end: nil, rewind: rewind, rewound: 0)
        let process = ProcessIdentity.current
        do {
            try pool.write { db in
                try db.execute(
                    sql: """
                        INSERT INTO run (id, context_id, pid, boot, process_start, started_at, rewind)
                        VALUES (?, ?, ?, ?, ?, ?, ?)
                        """,
                    arguments: [run.id, context.rawValue, Int64(run.pid), process.boot, process.start, now.microseconds, rewind])
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        return run
    }

    /// Marks a run as ended cleanly (a run already marked ended keeps its end).
    public func endRun(_ id: String, now: Timestamp = .now) throws {
        do {
            try pool.write { db in
                try db.execute(sql: "UPDATE run SET ending = 'clean', ended_at = ?, rewind = NULL WHERE id = ? AND ending IS NULL", arguments: [now.microseconds, id])
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// The latest runs, newest first.
    public func runs(limit: Int = 100) throws -> [StoreRun] {
        do {
            return try pool.read { db in
                try Row.fetchAll(
                    db, sql: "SELECT id, context_id, pid, started_at, ended_at, ending, rewind, rewound FROM run ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    arguments: [limit]
                ).map(Self.run)
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Finds the runs whose process is gone without closing them and marks each as ended
    /// uncleanly, at its last record (else now), its rewind buffer's records frozen into the
    /// store in the same transaction (each marked `dredge.rewound`) and the buffer's file
    /// removed. One process marks a run (the others find it marked). Returns the runs it marked.
    @discardableResult
    public func markUncleanEnds(now: Timestamp = .now) throws -> [StoreRun] {
        let current = ProcessIdentity.current
        let open: [(run: StoreRun, boot: String, start: Int64)]
        do {
            open = try pool.read { db in
                try Row.fetchAll(
                    db, sql: "SELECT id, context_id, pid, started_at, ended_at, ending, rewind, rewound, boot, process_start FROM run WHERE ending IS NULL"
                ).map { (Self.run($0), $0["boot"], $0["process_start"]) }
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        var marked: [StoreRun] = []
        for (run, boot, start) in open where !ProcessIdentity.isAlive(pid: run.pid, boot: boot, start: start, current: current) {
            // A buffer that is not one (damaged) holds nothing to freeze: the run is marked all the same.
            let ring: RewindBuffer?
            do { ring = try run.rewind.flatMap { try RewindBuffer.open(at: rewindDirectory + "/" + $0) } } catch is RewindBuffer.Failure { ring = nil }
            let records = ring?.records() ?? []
            var ended = run
            do {
                let won = try pool.write { db -> Bool in
                    let last = try Int64.fetchOne(db, sql: "SELECT max(ts) FROM log WHERE context_id = ? AND ts >= ?", arguments: [run.context.rawValue, run.startedAt.microseconds])
                    ended.endedAt = Timestamp(microseconds: max(last ?? now.microseconds, run.startedAt.microseconds))
                    try db.execute(
                        sql: "UPDATE run SET ending = 'unclean', ended_at = ?, rewind = NULL, rewound = ? WHERE id = ? AND ending IS NULL",
                        arguments: [ended.endedAt?.microseconds, records.count, run.id])
                    guard db.changesCount == 1 else { return false }
                    var inserter = RecordInserter(limits: configuration.limits)
                    try inserter.insert(ArraySlice(records.map { $0.entry(context: run.context, rewound: true) }), in: db)
                    return true
                }
                guard won else { continue }
            } catch {
                throw StoreError.wrap(error, path: path)
            }
            try ring?.close()
            if let name = run.rewind { try Self.removeRewindFile(rewindDirectory + "/" + name) }
            ended.end = .unclean
            ended.rewind = nil
            ended.rewound = records.count
            marked.append(ended)
        }
        return marked
    }

    /// Freezes a live rewind buffer into the store: its records, each marked `dredge.rewound`,
    /// in one transaction; then it is emptied. Returns how many.
    @discardableResult
    public func freeze(_ ring: RewindBuffer, context: ContextID) throws -> Int {
        let (records, end) = ring.snapshot()
        guard !records.isEmpty else { return 0 }
        do {
            try pool.write { db in
                var inserter = RecordInserter(limits: configuration.limits)
                try inserter.insert(ArraySlice(records.map { $0.entry(context: context, rewound: true) }), in: db)
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        ring.discard(through: end)
        return records.count
    }

    /// Removes a rewind buffer's file (nothing when it is gone already).
    public static func removeRewindFile(_ path: String) throws {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw StoreError(code: .writeFailed, message: "cannot remove the rewind buffer \(path): \(String(cString: strerror(errno)))", path: path)
        }
    }

    private static func run(_ row: Row) -> StoreRun {
        StoreRun(
            id: row["id"], context: ContextID(rawValue: row["context_id"]), pid: Int32(truncatingIfNeeded: row["pid"] as Int64),
            startedAt: Timestamp(microseconds: row["started_at"]), endedAt: (row["ended_at"] as Int64?).map(Timestamp.init(microseconds:)),
            end: (row["ending"] as String?).flatMap(StoreRun.End.init(rawValue:)), rewind: row["rewind"], rewound: row["rewound"])
    }

    private static func newRunID() -> String {
        var rng = SystemRandomNumberGenerator()
        return (0..<16).map { _ in String(format: "%02x", UInt8.random(in: .min ... .max, using: &rng)) }.joined()
    }
}

extension RewindRecord {
    /// The entry this record becomes in the store: marked rewound (metadata `dredge.rewound`).
    func entry(context: ContextID, rewound: Bool) -> LogEntry {
        var metadata: LogMetadata
        do {
            metadata = try JSONReading.decode(LogMetadata.self, from: metadataJSON)
        } catch {
            // Written by this library, so it reads back; should it not, the record is kept and says so.
            metadata = ["dredge.metadata_unreadable": .string(metadataJSON)]
        }
        if rewound { metadata["dredge.rewound"] = .bool(true) }
        return LogEntry(timestamp: timestamp, level: level, type: type, uid: uid, message: message, metadata: metadata, context: context)
    }
}

/// Which process a run was: its pid is reused after it dies, and after the machine restarts,
/// so the boot (`/proc/sys/kernel/random/boot_id`) and the process's start (field 22 of
/// `/proc/PID/stat`, in clock ticks since boot) say whether a live pid is still that process.
/// Where there is no `/proc` (macOS), a live pid is taken as the run's process.
struct ProcessIdentity {
    var boot: String
    var start: Int64

    static let current = ProcessIdentity(boot: bootID(), start: startTime(of: getpid()) ?? 0)

    static func bootID() -> String {
        ((try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Field 22 of `/proc/PID/stat` (after the command's closing parenthesis, which a command
    /// name may itself contain); nil when there is no such process.
    static func startTime(of pid: Int32) -> Int64? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // Fields after the command start at field 3 (state): field 22 is the 20th of them.
        guard fields.count >= 20 else { return nil }
        return Int64(fields[19])
    }

    /// Whether the process a run was still runs.
    static func isAlive(pid: Int32, boot: String, start: Int64, current: ProcessIdentity) -> Bool {
        guard !current.boot.isEmpty else { return kill(pid, 0) == 0 || errno == EPERM }
        guard boot == current.boot, let now = startTime(of: pid) else { return false }
        return now == start
    }
}
