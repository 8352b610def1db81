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
/// (a crash, a kill, the OOM killer, the machine restarting, or an app that exits without
/// closing its center) is found by the next center that opens the store and marked as ended
/// uncleanly, its rewind buffer frozen into the store with it: what a crash capture uploads.
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
    /// When it ended: its close, or (unclean) its last record, stored or rewound.
    public var endedAt: Timestamp?
    public var end: End?
    /// The rewind buffer's file (a name beside the store, in ``LogStore/rewindDirectory``) while
    /// it may hold records not yet frozen.
    public var rewind: String?
    /// Records frozen from its rewind buffer when it ended uncleanly.
    public var rewound: Int
}

/// What ``LogStore/markUncleanEnds(now:)`` found.
public struct UncleanEnds: Sendable {
    /// The runs it marked as ended uncleanly.
    public var marked: [StoreRun] = []
    /// What it could not do, one sentence each (a run left for the next look, a file it could
    /// not remove); nothing is lost by them.
    public var problems: [String] = []
}

extension LogStore {
    /// Where the store's processes keep their rewind buffers: `<store>-rewind/`, one file a run.
    public var rewindDirectory: String { path + "-rewind" }

    /// The ended runs kept (the newest); older ones are dropped as runs are looked at.
    static let endedRunsKept = 1_000
    /// Records a frozen buffer is stored in per statement batch.
    static let freezeBatch = 1_000

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
                        INSERT INTO run (id, context_id, pid, pid_namespace, boot, process_start, started_at, rewind)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                        """,
                    arguments: [run.id, context.rawValue, Int64(run.pid), process.namespace, process.boot, process.start, now.microseconds, rewind])
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

    /// The runs marked ended uncleanly whose end is at or after `since`, oldest end first.
    public func uncleanRuns(endedSince since: Timestamp, limit: Int = 200) throws -> [StoreRun] {
        do {
            return try pool.read { db in
                try Row.fetchAll(
                    db,
                    sql: """
                        SELECT id, context_id, pid, started_at, ended_at, ending, rewind, rewound FROM run
                        WHERE ending = 'unclean' AND ended_at >= ? ORDER BY ended_at, rowid LIMIT ?
                        """,
                    arguments: [since.microseconds, limit]
                ).map(Self.run)
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
    /// uncleanly, at its last record (stored or rewound), its rewind buffer's records stored in
    /// the same transaction (each marked `dredge.rewound`) and the buffer's file removed. One
    /// process marks a run (the others find it marked). A run it cannot judge (another pid
    /// namespace) or whose buffer it cannot read now is left for a later look; a buffer that is
    /// not one (damaged) holds nothing to store, and another user's is left alone. Also removes
    /// ring files no open run names (left by a kill between a run's end and its file's removal)
    /// and keeps the newest ``endedRunsKept`` ended runs.
    ///
    /// With `onlyReadable` (the agent's look, #54: it may run as another user than the apps), a
    /// run whose buffer it cannot read now or is another user's is left as it is, for the app's
    /// next run to mark with what its buffer holds.
    public func markUncleanEnds(now: Timestamp = .now, onlyReadable: Bool = false) throws -> UncleanEnds {
        let current = ProcessIdentity.current
        // The files first, then the runs: a file is made only after its run's row, so a file
        // listed here whose run is not open in the read below is one nothing will use.
        let files = (try? FileManager.default.contentsOfDirectory(atPath: rewindDirectory)) ?? []  // no directory: no files
        let open: [(run: StoreRun, namespace: String, boot: String, start: Int64)]
        do {
            open = try pool.read { db in
                try Row.fetchAll(
                    db,
                    sql: "SELECT id, context_id, pid, started_at, ended_at, ending, rewind, rewound, pid_namespace, boot, process_start FROM run WHERE ending IS NULL"
                ).map { (Self.run($0), $0["pid_namespace"], $0["boot"], $0["process_start"]) }
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        var found = UncleanEnds()
        for (run, namespace, boot, start) in open {
            guard ProcessIdentity.isGone(pid: run.pid, namespace: namespace, boot: boot, start: start, current: current) else { continue }
            do {
                if let marked = try markUnclean(run, now: now, onlyReadable: onlyReadable) { found.marked.append(marked) }
            } catch {
                found.problems.append("cannot mark run \(run.id) (pid \(run.pid)) as ended uncleanly now; it is tried again: \(error)")
            }
        }
        let named = Set(open.compactMap(\.run.rewind))
        for name in files where !named.contains(name) {
            do { try Self.removeRewindFile(rewindDirectory + "/" + name) } catch { found.problems.append("\(error)") }
        }
        do {
            try pool.write { db in
                try db.execute(
                    sql: "DELETE FROM run WHERE ending IS NOT NULL AND id NOT IN (SELECT id FROM run WHERE ending IS NOT NULL ORDER BY started_at DESC LIMIT ?)",
                    arguments: [Self.endedRunsKept])
            }
        } catch {
            found.problems.append("cannot drop the oldest ended runs: \(error)")
        }
        return found
    }

    /// Marks one gone run; nil when another process marked it first, or its buffer cannot be
    /// read now.
    private func markUnclean(_ run: StoreRun, now: Timestamp, onlyReadable: Bool) throws -> StoreRun? {
        var ring: RewindBuffer?
        var keepFile = false
        if let name = run.rewind {
            do {
                ring = try RewindBuffer.open(at: rewindDirectory + "/" + name)
            } catch let failure as RewindBuffer.Failure {
                switch failure.kind {
                case .damaged: ring = nil
                case .foreign:
                    if onlyReadable { throw failure }
                    keepFile = true
                case .unavailable: throw failure
                }
            }
        }
        defer { try? ring?.close() }  // an unmapping that fails loses nothing: the records are stored
        var ended = run
        let won: Bool
        do {
            won = try pool.write { db -> Bool in
                var inserter = RecordInserter(limits: configuration.limits)
                var batch: [LogEntry] = []
                var count = 0, lastRewound: Int64 = .min
                try ring?.forEachRecord { record in
                    batch.append(record.entry(context: run.context, rewound: true))
                    lastRewound = max(lastRewound, record.timestamp.microseconds)
                    count += 1
                    if batch.count == Self.freezeBatch {
                        try inserter.insert(batch[...], in: db)
                        batch.removeAll(keepingCapacity: true)
                    }
                }
                if !batch.isEmpty { try inserter.insert(batch[...], in: db) }
                // Its last stored record: the newest of its context since it started (read back
                // from the end of the time index, which is where a crashed run's records are).
                let lastStored = try Int64.fetchOne(
                    db, sql: "SELECT ts FROM log WHERE ts >= ? AND context_id = ? ORDER BY ts DESC LIMIT 1",
                    arguments: [run.startedAt.microseconds, run.context.rawValue])
                ended.endedAt = Timestamp(microseconds: max(lastStored ?? .min, lastRewound, run.startedAt.microseconds))
                try db.execute(
                    sql: "UPDATE run SET ending = 'unclean', ended_at = ?, rewind = NULL, rewound = ? WHERE id = ? AND ending IS NULL",
                    arguments: [ended.endedAt?.microseconds, count, run.id])
                guard db.changesCount == 1 else {
                    // Another process marked it first: what was stored here goes back.
                    throw RollBack()
                }
                ended.rewound = count
                return true
            }
        } catch is RollBack {
            won = false
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        guard won else { return nil }
        if let name = run.rewind, !keepFile { try Self.removeRewindFile(rewindDirectory + "/" + name) }
        ended.end = .unclean
        ended.rewind = nil
        return ended
    }

    private struct RollBack: Error {}

    /// Freezes a live rewind buffer into the store: its records, each marked `dredge.rewound`,
    /// in one transaction; then it lets them go. Two freezes of one buffer take turns, so no
    /// record is stored twice by them. Returns how many.
    @discardableResult
    public func freeze(_ ring: RewindBuffer, context: ContextID) throws -> Int {
        ring.freezing.lock()
        defer { ring.freezing.unlock() }
        // Copied under the ring's lock, stored outside it: the app's log calls (which append
        // under that lock) never wait for the database.
        let (records, end) = ring.snapshot()
        guard !records.isEmpty else { return 0 }
        do {
            try pool.write { db in
                var inserter = RecordInserter(limits: configuration.limits)
                var batch: [LogEntry] = []
                batch.reserveCapacity(min(records.count, Self.freezeBatch))
                for record in records {
                    batch.append(record.entry(context: context, rewound: true))
                    if batch.count == Self.freezeBatch {
                        try inserter.insert(batch[...], in: db)
                        batch.removeAll(keepingCapacity: true)
                    }
                }
                if !batch.isEmpty { try inserter.insert(batch[...], in: db) }
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

/// Which process a run was. Its pid is reused after it dies, and after the machine restarts,
/// so the boot (`/proc/sys/kernel/random/boot_id`) and the process's start (field 22 of
/// `/proc/PID/stat`, in clock ticks since boot) say whether a live pid is still that process;
/// a run of another pid namespace (another container sharing the store) is never judged from
/// this one. Where there is no `/proc` (macOS), a live pid is taken as the run's process.
struct ProcessIdentity {
    var namespace: String
    var boot: String
    var start: Int64

    static let current = ProcessIdentity(namespace: pidNamespace(), boot: bootID(), start: startTime(of: getpid()) ?? 0)

    static func bootID() -> String {
        ((try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)  // none: not Linux
    }

    /// `pid:[N]` of `/proc/self/ns/pid`; empty where there is none.
    static func pidNamespace() -> String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid")) ?? ""  // none: not Linux
    }

    /// Field 22 of `/proc/PID/stat` (after the command's closing parenthesis, which a command
    /// name may itself contain); nil when it cannot be read.
    static func startTime(of pid: Int32) -> Int64? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return nil }  // gone, or hidden
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // Fields after the command start at field 3 (state): field 22 is the 20th of them.
        guard fields.count >= 20 else { return nil }
        return Int64(fields[19])
    }

    /// Whether the process a run was is gone: only when that is known. Another namespace's run
    /// is not judged; a run from before the machine restarted is gone; a pid no process has
    /// is gone; a live pid whose start time reads differently is another process.
    static func isGone(pid: Int32, namespace: String, boot: String, start: Int64, current: ProcessIdentity) -> Bool {
        if namespace != current.namespace { return false }
        #if os(Linux)
        // Neither side's pid namespace known (no /proc): a pid cannot be judged.
        if namespace.isEmpty { return false }
        #endif
        if !boot.isEmpty, !current.boot.isEmpty, boot != current.boot { return true }
        if kill(pid, 0) != 0 && errno == ESRCH { return true }
        if start != 0, let now = startTime(of: pid), now != start { return true }
        return false
    }
}
