import DredgeDomain
import Foundation
import GRDB

/// What one retention pass did.
public struct RetentionReport: Hashable, Sendable {
    public var deletedByAge: Int64 = 0
    public var deletedBySize: Int64 = 0
    public var bytesBefore: Int64 = 0
    public var bytesAfter: Int64 = 0
    public var losses: [LossRecord] = []
    /// The policy the pass applied, as the store recorded it; nil when it records none (or one
    /// that does not read back): then nothing is deleted by age, and only ``maxBytes``, the
    /// opening configuration's size, bounds the store.
    public var policy: RetentionPolicy?
    /// The size the pass held the store under.
    public var maxBytes: Int64 = 0
}

/// Retention: deletes the oldest records by age, then by size, under the policy the store
/// records (``StoredRetention``, read at the start of every pass, so a policy its owner changed
/// applies in every process that has it open), records each deletion in the loss table, and
/// gives the freed pages back to the file system (`auto_vacuum=INCREMENTAL` plus a truncating
/// WAL checkpoint), so the file really shrinks. A store that records no policy loses nothing by
/// age, and is held only under the opening configuration's size.
///
/// Deletion runs in chunks of ``chunkSize`` records, one transaction each, so a large pass
/// neither holds the write lock for long nor grows the WAL without bound.
struct Retention {
    var path: String
    /// The size a store that records no policy is held under (no age limit then): the opening
    /// configuration's ``RetentionPolicy/maxBytes``, a guard for the disk, as before policies
    /// were recorded.
    var safeguardBytes: Int64
    var chunkSize = 20_000

    /// What a pass applies, read in the transaction that deletes: the store's policy, or, where
    /// it records none (or one that does not read back), only the size safeguard.
    struct Limits: Equatable {
        var maxAge: Duration?
        var maxBytes: Int64
        var lowWaterFraction: Double
        var recorded: RetentionPolicy?
    }

    func limits(_ db: Database) throws -> Limits {
        if case .recorded(let stored) = try StoredRetention.look(db) {
            let p = stored.policy
            return Limits(maxAge: p.maxAge, maxBytes: p.maxBytes, lowWaterFraction: p.lowWaterFraction, recorded: p)
        }
        return Limits(maxAge: nil, maxBytes: safeguardBytes, lowWaterFraction: RetentionPolicy().lowWaterFraction, recorded: nil)
    }

    /// One pass. Every chunk decides what to delete in the write transaction that deletes it,
    /// from the policy as recorded then: two processes running passes at once (the app and its
    /// agent) never delete more than the policy allows between them.
    func run(pool: DatabasePool, now: Timestamp) throws -> RetentionReport {
        var report = RetentionReport()
        report.bytesBefore = Self.bytesOnDisk(path)
        let first = try pool.read { db in try limits(db) }
        report.policy = first.recorded
        report.maxBytes = first.maxBytes

        // Age: the oldest records before the cutoff, chunk by chunk.
        report.deletedByAge = try deleteOldest(reason: .retentionAge, pool: pool, now: now, into: &report) { db, limits in
            guard let maxAge = limits.maxAge else { return nil }
            let cutoff = now.subtracting(maxAge).microseconds
            return ("WHERE ts < \(cutoff)", Int64(chunkSize))
        }

        if Self.bytesOnDisk(path) > first.maxBytes {
            try reclaim(pool)
            // A chunk at a time, each counted in the transaction that deletes it, with the pages
            // given back in between (so the next count sees them gone).
            for _ in 0..<500 {
                let deleted = try deleteOldest(reason: .retentionSize, pool: pool, now: now, into: &report, once: true) { db, limits in
                    let used = try usedBytes(db)
                    let count = try Int64.fetchOne(db, sql: "SELECT count(*) FROM log") ?? 0
                    let target = Int64(Double(limits.maxBytes) * limits.lowWaterFraction)
                    guard count > 0, used > target else { return nil }
                    let perRecord = max(1, used / count)
                    let excess = (used - target + perRecord - 1) / perRecord
                    return ("", min(count, excess, Int64(chunkSize)))
                }
                report.deletedBySize += deleted
                try reclaim(pool)
                if deleted == 0 { break }
            }
        }
        if report.deletedByAge > 0 && report.deletedBySize == 0 { try reclaim(pool) }
        report.bytesAfter = Self.bytesOnDisk(path)
        return report
    }

    /// Deletes the oldest records (by timestamp, then id) in chunks, one transaction each:
    /// `select` says, in that transaction and from the policy recorded then, which (a `WHERE`
    /// clause) and at most how many, or nil for none. Stops when a chunk deletes nothing (or
    /// after one chunk, with `once`).
    private func deleteOldest(
        reason: LossReason, pool: DatabasePool, now: Timestamp, into report: inout RetentionReport, once: Bool = false,
        select: (Database, Limits) throws -> (condition: String, limit: Int64)?
    ) throws -> Int64 {
        var deleted: Int64 = 0
        while true {
            let loss: LossRecord? = try pool.write { db in
                guard let (condition, n) = try select(db, try limits(db)), n > 0 else { return nil }
                let oldest = "SELECT id, ts FROM log \(condition) ORDER BY ts, id LIMIT \(n)"
                guard let row = try Row.fetchOne(db, sql: "SELECT count(*), min(ts), max(ts) FROM (\(oldest))"),
                    let c: Int64 = row[0], c > 0, let first: Int64 = row[1], let last: Int64 = row[2]
                else { return nil }
                try db.execute(sql: "DELETE FROM log WHERE id IN (SELECT id FROM (\(oldest)))")
                let loss = LossRecord(recordedAt: now, reason: reason, count: c, first: Timestamp(microseconds: first), last: Timestamp(microseconds: last))
                try LossTable.insert(loss, db: db)
                return loss
            }
            guard let loss else { break }
            report.losses.append(loss)
            deleted += loss.count
            if once { break }
        }
        return deleted
    }

    /// Frees pages to the file system and truncates the WAL.
    private func reclaim(_ pool: DatabasePool) throws {
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA incremental_vacuum")
            _ = try? db.checkpoint(.truncate)
        }
    }

    private func usedBytes(_ db: Database) throws -> Int64 {
        let pages = try Int64.fetchOne(db, sql: "PRAGMA page_count") ?? 0
        let free = try Int64.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
        let size = try Int64.fetchOne(db, sql: "PRAGMA page_size") ?? 4096
        return (pages - free) * size
    }

    /// The database file plus its WAL, as the file system sees them.
    static func bytesOnDisk(_ path: String) -> Int64 {
        fileSize(path) + fileSize(path + "-wal")
    }

    static func fileSize(_ path: String) -> Int64 {
        var st = stat()
        return stat(path, &st) == 0 ? Int64(st.st_size) : 0
    }
}

/// Reads and writes the loss table.
enum LossTable {
    static func insert(_ loss: LossRecord, db: Database) throws {
        try db.execute(
            sql: "INSERT INTO loss (recorded_at, reason, count, first_ts, last_ts) VALUES (?, ?, ?, ?, ?)",
            arguments: [loss.recordedAt.microseconds, loss.reason.rawValue, loss.count, loss.first.microseconds, loss.last.microseconds])
    }

    static func fetch(db: Database, overlapping since: Timestamp?, _ until: Timestamp?) throws -> [LossRecord] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT recorded_at, reason, count, first_ts, last_ts FROM loss
                WHERE last_ts >= ? AND first_ts < ? ORDER BY first_ts, id
                """,
            arguments: [since?.microseconds ?? Int64.min, until?.microseconds ?? Int64.max]
        ).map { row in
            LossRecord(
                recordedAt: Timestamp(microseconds: row[0]), reason: LossReason(rawValue: row[1]), count: row[2],
                first: Timestamp(microseconds: row[3]), last: Timestamp(microseconds: row[4]))
        }
    }
}
