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
    /// The policy the pass applied, as the store recorded it; nil when it records none (the
    /// pass deleted nothing).
    public var policy: RetentionPolicy?
}

/// Retention: deletes the oldest records by age, then by size, under the policy the store
/// records (``StoredRetention``, read at the start of every pass, so a policy its owner changed
/// applies in every process that has it open), records each deletion in the loss table, and
/// gives the freed pages back to the file system (`auto_vacuum=INCREMENTAL` plus a truncating
/// WAL checkpoint), so the file really shrinks. A store that records no policy loses nothing.
///
/// Deletion runs in chunks of ``chunkSize`` records, one transaction each, so a large pass
/// neither holds the write lock for long nor grows the WAL without bound.
struct Retention {
    var path: String
    var chunkSize = 20_000

    func run(pool: DatabasePool, now: Timestamp) throws -> RetentionReport {
        var report = RetentionReport()
        report.bytesBefore = Self.bytesOnDisk(path)
        guard let policy = try pool.read({ db in try StoredRetention.read(db)?.policy }) else {
            report.bytesAfter = report.bytesBefore
            return report
        }
        report.policy = policy

        let cutoff = now.subtracting(policy.maxAge)
        let expired = try pool.read { db in
            try Int64.fetchOne(db, sql: "SELECT count(*) FROM log WHERE ts < ?", arguments: [cutoff.microseconds]) ?? 0
        }
        if expired > 0 {
            report.deletedByAge = try deleteOldest(expired, reason: .retentionAge, pool: pool, now: now, into: &report)
        }

        if Self.bytesOnDisk(path) > policy.maxBytes {
            try reclaim(pool)
            let target = Int64(Double(policy.maxBytes) * policy.lowWaterFraction)
            for _ in 0..<50 {
                let (used, count) = try pool.read { db in
                    (try usedBytes(db), try Int64.fetchOne(db, sql: "SELECT count(*) FROM log") ?? 0)
                }
                guard count > 0, used > target else { break }
                let perRecord = max(1, used / count)
                let excess = (used - target + perRecord - 1) / perRecord
                let deleted = try deleteOldest(min(count, excess), reason: .retentionSize, pool: pool, now: now, into: &report)
                report.deletedBySize += deleted
                try reclaim(pool)
                if deleted == 0 { break }
            }
        }
        if report.deletedByAge > 0 && report.deletedBySize == 0 { try reclaim(pool) }
        report.bytesAfter = Self.bytesOnDisk(path)
        return report
    }

    /// Deletes the `count` oldest records (by timestamp, then id) in chunks.
    private func deleteOldest(_ count: Int64, reason: LossReason, pool: DatabasePool, now: Timestamp, into report: inout RetentionReport) throws -> Int64 {
        var remaining = count
        var deleted: Int64 = 0
        while remaining > 0 {
            let n = min(remaining, Int64(chunkSize))
            let loss: LossRecord? = try pool.write { db in
                let oldest = "SELECT id, ts FROM log ORDER BY ts, id LIMIT \(n)"
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
            remaining -= loss.count
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

    private func usedBytes(_ pool: DatabasePool) throws -> Int64 {
        try pool.read { db in try usedBytes(db) }
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
