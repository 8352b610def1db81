import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import GRDB

/// The live tails in the server's database (``TailRegistry``): the `tail` table, one row per
/// tail, and `tail_part`, one row per device that was sent it.
public final class SQLiteTailRegistry: TailRegistry, Sendable {
    let db: DatabasePool

    public init(_ database: ServerDatabase) { db = database.pool }

    static func schema(_ migrator: inout DatabaseMigrator) {
        // Live tails (#53): seqs and cursors are u64 kept as the same 64 bits.
        migrator.registerMigration("tails-v1") { db in
            try db.execute(sql: """
                CREATE TABLE tail (
                    id TEXT PRIMARY KEY NOT NULL,
                    uid TEXT NOT NULL,
                    agents TEXT,
                    filter TEXT NOT NULL,
                    issued_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    records_per_s INTEGER NOT NULL,
                    bytes_per_s INTEGER NOT NULL,
                    is_verbose INTEGER NOT NULL,
                    verbose_types TEXT NOT NULL,
                    requested_by TEXT NOT NULL,
                    reason TEXT NOT NULL,
                    created_at REAL NOT NULL,
                    stopped_at REAL,
                    stopped_by TEXT,
                    stop_reason TEXT,
                    removed_at REAL,
                    removed_by TEXT,
                    removed_reason TEXT
                );
                CREATE INDEX tail_open ON tail(expires_at) WHERE stopped_at IS NULL;
                CREATE INDEX tail_by_creation ON tail(created_at);
                CREATE INDEX tail_kept ON tail(stopped_at) WHERE removed_at IS NULL;
                CREATE TABLE tail_part (
                    tail_id TEXT NOT NULL REFERENCES tail(id),
                    agent_id TEXT NOT NULL,
                    status TEXT NOT NULL,
                    detail TEXT NOT NULL DEFAULT '',
                    wrapped_key BLOB,
                    start_cursor INTEGER,
                    held_seq INTEGER NOT NULL DEFAULT 0,
                    held_cursor INTEGER NOT NULL DEFAULT 0,
                    records INTEGER NOT NULL DEFAULT 0,
                    dropped INTEGER NOT NULL DEFAULT 0,
                    bytes INTEGER NOT NULL DEFAULT 0,
                    updated_at REAL NOT NULL,
                    PRIMARY KEY (tail_id, agent_id)
                );
                """)
        }
    }

    public func create(_ tail: NewTail) async throws {
        let (filter, agents, verboseTypes) = try TailRows.encoded(tail)
        let now = Date().timeIntervalSince1970
        try await db.write { db in
            try db.run(
                """
                INSERT INTO tail (id, uid, agents, filter, issued_at, expires_at, records_per_s, bytes_per_s, is_verbose, verbose_types, requested_by, reason, created_at, urgent)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [
                    tail.id, tail.uid, agents, filter, tail.issuedAt.microseconds, tail.expiresAt.microseconds, Int64(tail.recordsPerSecond),
                    TailRows.stored(tail.bytesPerSecond), tail.verbose, verboseTypes, tail.requestedBy.storable, tail.reason.storable, now, tail.urgent,
                ])
            try AuditRow.chained(at: now, actor: tail.requestedBy, action: AuditAction.tail.rawValue, detail: tail.auditDetail, in: db).insert(db)
        }
    }

    public func tail(_ id: String) async throws -> TailRecord? {
        try await db.read { try Self.tail(id, in: $0) }
    }

    public func tails(limit: Int) async throws -> [TailRecord] {
        try await db.read { db in
            let rows = try prepared("SELECT * FROM tail ORDER BY created_at DESC, id DESC LIMIT ?", [max(0, limit)], as: Row.self).fetchAll(db)
            return try rows.map { try Self.record($0, in: db) }
        }
    }

    public func due(for agentID: String, uids: Set<String>, now: Timestamp) async throws -> [DueTail] {
        guard !uids.isEmpty else { return [] }
        // The open tails are few: match the agent's uids (maybe thousands) in memory.
        return try await db.read { db in
            let rows = try prepared("SELECT * FROM tail WHERE stopped_at IS NULL AND expires_at > ? ORDER BY created_at, id", [now.microseconds], as: Row.self)
                .fetchAll(db)
            var due: [DueTail] = []
            for row in rows where uids.contains(row["uid"] as String) {
                let tail = try Self.record(row, in: db)
                if let agents = tail.agents, !agents.contains(agentID) { continue }
                let part = try prepared("SELECT status, wrapped_key FROM tail_part WHERE tail_id = ? AND agent_id = ?", [tail.id, agentID], as: Row.self).fetchOne(db)
                if let part, try TailRows.status(part["status"], of: tail.id).isFinal { continue }
                due.append(DueTail(tail: tail, wrappedKey: (part?["wrapped_key"] as Data?).map(Array.init)))
            }
            return due
        }
    }

    public func deliver(_ tailID: String, agent: String, wrappedKey: [UInt8], at: Date) async throws -> [UInt8]? {
        try await db.write { db in
            guard let tail = try prepared("SELECT expires_at, stopped_at FROM tail WHERE id = ?", [tailID], as: Row.self).fetchOne(db),
                tail["stopped_at"] as Double? == nil, (tail["expires_at"] as Int64) > Timestamp(at).microseconds
            else { return nil }
            if let part = try prepared("SELECT status, wrapped_key FROM tail_part WHERE tail_id = ? AND agent_id = ?", [tailID, agent], as: Row.self).fetchOne(db) {
                guard try !TailRows.status(part["status"], of: tailID).isFinal, let key = part["wrapped_key"] as Data? else { return nil }
                return Array(key)
            }
            try db.run(
                "INSERT INTO tail_part (tail_id, agent_id, status, wrapped_key, updated_at) VALUES (?, ?, ?, ?, ?)",
                [tailID, agent, TailPartStatus.delivered.rawValue, Data(wrappedKey), at.timeIntervalSince1970])
            return wrappedKey
        }
    }

    public func accepted(_ tailID: String, agent: String, startCursor: UInt64, at: Date) async throws -> TailHold? {
        try await db.write { db in
            guard let (tail, part) = try Self.takingPart(tailID, agent: agent, at: at, in: db) else { return nil }
            var hold = part
            if part.seq == 0 && (part.start == nil) {
                hold.cursor = startCursor
            }
            try db.run(
                "UPDATE tail_part SET status = ?, start_cursor = coalesce(start_cursor, ?), held_cursor = ?, updated_at = ? WHERE tail_id = ? AND agent_id = ?",
                [TailPartStatus.running.rawValue, TailRows.stored(startCursor), TailRows.stored(hold.cursor), at.timeIntervalSince1970, tailID, agent])
            return TailHold(uid: tail.uid, expiresAt: tail.expiresAt, wrappedKey: hold.key, seq: hold.seq, cursor: hold.cursor, bytes: hold.bytes)
        }
    }

    public func hold(_ tailID: String, agent: String, at: Date) async throws -> TailHold? {
        try await db.read { db in
            guard let (tail, part) = try Self.takingPart(tailID, agent: agent, at: at, in: db), part.running else { return nil }
            return TailHold(uid: tail.uid, expiresAt: tail.expiresAt, wrappedKey: part.key, seq: part.seq, cursor: part.cursor, bytes: part.bytes)
        }
    }

    public func held(_ tailID: String, agent: String, seq: UInt64, cursor: UInt64, records: Int, dropped: UInt64, bytes: Int64, at: Date) async throws -> Bool {
        try await db.write { db in
            guard let (_, part) = try Self.takingPart(tailID, agent: agent, at: at, in: db), part.running, part.seq &+ 1 == seq, cursor > part.cursor else { return false }
            try db.run(
                """
                UPDATE tail_part SET held_seq = ?, held_cursor = ?, records = records + ?, dropped = dropped + ?, bytes = ?, updated_at = ?
                WHERE tail_id = ? AND agent_id = ?
                """,
                [TailRows.stored(seq), TailRows.stored(cursor), records, TailRows.stored(dropped), bytes, at.timeIntervalSince1970, tailID, agent])
            return true
        }
    }

    public func endPart(_ tailID: String, agent: String, status: TailPartStatus, detail: String, at: Date) async throws -> Bool {
        guard status.isFinal else { throw DeploymentError("a tail's part ends as rejected or ended, not \(status.rawValue)") }
        return try await db.write { db in
            try db.run(
                "UPDATE tail_part SET status = ?, detail = ?, wrapped_key = NULL, updated_at = ? WHERE tail_id = ? AND agent_id = ? AND status IN (?, ?)",
                [status.rawValue, detail.storable, at.timeIntervalSince1970, tailID, agent, TailPartStatus.delivered.rawValue, TailPartStatus.running.rawValue])
            return db.changesCount > 0
        }
    }

    public func stop(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> TailStopMark? {
        try await db.write { db in try Self.stop(tailID, by: actor, reason: reason, at: at, in: db) }
    }

    public func stopExpired(now: Timestamp) async throws -> [String] {
        try await db.write { db in
            // Past the grace after expiry: batches of the grace are still taken (Protocol § 20).
            let cutoff = now.microseconds - TailRows.grace
            let ids = try prepared("SELECT id FROM tail WHERE stopped_at IS NULL AND expires_at <= ? ORDER BY expires_at, id", [cutoff], as: String.self).fetchAll(db)
            for id in ids { _ = try Self.stop(id, by: TailRows.server, reason: "expired", at: now.date, in: db) }
            return ids
        }
    }

    public func openCount(requestedBy: String?, now: Timestamp) async throws -> Int {
        try await db.read { db in
            if let requestedBy {
                return try prepared(
                    "SELECT count(*) FROM tail WHERE stopped_at IS NULL AND expires_at > ? AND requested_by = ?", [now.microseconds, requestedBy.storable], as: Int.self
                ).fetchOne(db) ?? 0
            }
            return try prepared("SELECT count(*) FROM tail WHERE stopped_at IS NULL AND expires_at > ?", [now.microseconds], as: Int.self).fetchOne(db) ?? 0
        }
    }

    public func markRemoved(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark? {
        try await db.write { db in
            guard let tail = try Self.tail(tailID, in: db) else { return nil }
            if let earlier = tail.removed { return RemovalMark(removal: earlier, isNew: false) }
            if tail.stopped == nil { _ = try Self.stop(tailID, by: actor, reason: "its records were removed" + (reason.isEmpty ? "" : ": \(reason)"), at: at, in: db) }
            try db.run(
                "UPDATE tail SET removed_at = ?, removed_by = ?, removed_reason = ? WHERE id = ?", [at.timeIntervalSince1970, actor.storable, reason.storable, tailID])
            return RemovalMark(removal: Removal(at: at, by: actor, reason: reason), isNew: true)
        }
    }

    public func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { db in
            try prepared(
                "SELECT id FROM tail WHERE removed_at IS NULL AND stopped_at IS NOT NULL AND stopped_at <= ? ORDER BY stopped_at, id LIMIT ?",
                [cutoff.timeIntervalSince1970, max(0, limit)], as: String.self
            ).fetchAll(db)
        }
    }

    // MARK: Rows

    private static func stop(_ tailID: String, by actor: String, reason: String, at: Date, in db: Database) throws -> TailStopMark? {
        guard let before = try tail(tailID, in: db) else { return nil }
        if before.stopped != nil { return TailStopMark(tail: before, isNew: false) }
        let when = at.timeIntervalSince1970
        try db.run("UPDATE tail SET stopped_at = ?, stopped_by = ?, stop_reason = ? WHERE id = ?", [when, actor.storable, reason.storable, tailID])
        try db.run(
            "UPDATE tail_part SET status = ?, detail = ?, wrapped_key = NULL, updated_at = ? WHERE tail_id = ? AND status IN (?, ?)",
            [TailPartStatus.ended.rawValue, TailRows.stoppedDetail(reason).storable, when, tailID, TailPartStatus.delivered.rawValue, TailPartStatus.running.rawValue])
        guard let after = try tail(tailID, in: db) else { return nil }
        try AuditRow.chained(at: when, actor: actor, action: AuditAction.tailStop.rawValue, detail: after.stopDetail(by: actor, reason: reason, at: at), in: db).insert(db)
        return TailStopMark(tail: after, isNew: true)
    }

    /// The tail and the agent's part when a batch or an acceptance may still be taken: the tail
    /// open at `at` (grace included), the part delivered or running.
    private static func takingPart(_ tailID: String, agent: String, at: Date, in db: Database) throws -> (TailRecord, TailRows.Part)? {
        guard let tail = try tail(tailID, in: db), tail.stopped == nil, Timestamp(at).microseconds <= TailRows.lastTaken(tail.expiresAt.microseconds),
            let row = try prepared("SELECT * FROM tail_part WHERE tail_id = ? AND agent_id = ?", [tailID, agent], as: Row.self).fetchOne(db),
            let key = row["wrapped_key"] as Data?
        else { return nil }
        let status = try TailRows.status(row["status"], of: tailID)
        guard !status.isFinal else { return nil }
        return (
            tail,
            TailRows.Part(
                running: status == .running, start: (row["start_cursor"] as Int64?).map(TailRows.read), seq: TailRows.read(row["held_seq"]),
                cursor: TailRows.read(row["held_cursor"]), bytes: row["bytes"], key: Array(key))
        )
    }

    static func tail(_ id: String, in db: Database) throws -> TailRecord? {
        guard let row = try prepared("SELECT * FROM tail WHERE id = ?", [id], as: Row.self).fetchOne(db) else { return nil }
        return try record(row, in: db)
    }

    private static func record(_ row: Row, in db: Database) throws -> TailRecord {
        let id: String = row["id"]
        let parts = try prepared("SELECT * FROM tail_part WHERE tail_id = ? ORDER BY agent_id", [id], as: Row.self).fetchAll(db).map { p in
            TailPart(
                agentID: p["agent_id"], status: try TailRows.status(p["status"], of: id), detail: p["detail"],
                startCursor: (p["start_cursor"] as Int64?).map(TailRows.read), heldSeq: TailRows.read(p["held_seq"]), heldCursor: TailRows.read(p["held_cursor"]),
                records: p["records"], dropped: p["dropped"], bytes: p["bytes"], updatedAt: Date(timeIntervalSince1970: p["updated_at"]))
        }
        let stoppedAt: Double? = row["stopped_at"]
        let reason: String = row["reason"]
        return TailRecord(
            id: id, uid: row["uid"], agents: try (row["agents"] as String?).map { try TailRows.strings($0, of: id, "devices") },
            filter: try TailRows.filter(row["filter"], of: id), issuedAt: Timestamp(microseconds: row["issued_at"]), expiresAt: Timestamp(microseconds: row["expires_at"]),
            recordsPerSecond: UInt32(clamping: row["records_per_s"] as Int64), bytesPerSecond: TailRows.read(row["bytes_per_s"]), verbose: row["is_verbose"],
            verboseTypes: try TailRows.strings(row["verbose_types"], of: id, "verbose types"), requestedBy: row["requested_by"], reason: reason.isEmpty ? nil : reason,
            createdAt: Date(timeIntervalSince1970: row["created_at"]),
            stopped: stoppedAt.map { TailStopping(at: Date(timeIntervalSince1970: $0), by: row["stopped_by"] ?? "", reason: row["stop_reason"] ?? "") }, parts: parts,
            removed: Removal(at: row["removed_at"], by: row["removed_by"], reason: row["removed_reason"]), urgent: row["urgent"])
    }
}
