import DredgeAdminAPI
import DredgeDomain
import Foundation
import DredgeWire
import GRDB

/// The standing triggers in the server's database (``TriggerRegistry``): `standing_trigger`, one
/// row per trigger, and `trigger_change`, one row per change (its rowid is the version).
public final class SQLiteTriggerRegistry: TriggerRegistry, Sendable {
    let db: DatabasePool

    public init(_ database: ServerDatabase) { db = database.pool }

    static func schema(_ migrator: inout DatabaseMigrator) {
        // Standing triggers (#54). `trigger` is a keyword of SQL: the table is `standing_trigger`.
        migrator.registerMigration("triggers-v1") { db in
            try db.execute(sql: """
                CREATE TABLE standing_trigger (
                    id TEXT PRIMARY KEY NOT NULL,
                    definition TEXT NOT NULL,
                    maker_scope TEXT NOT NULL,
                    uid TEXT,
                    created_at REAL NOT NULL,
                    created_by TEXT NOT NULL,
                    reason TEXT NOT NULL,
                    expires_at INTEGER NOT NULL,
                    disabled_at REAL,
                    disabled_by TEXT,
                    disabled_reason TEXT,
                    removed_at REAL,
                    removed_by TEXT,
                    removed_reason TEXT
                );
                CREATE INDEX standing_trigger_in_force ON standing_trigger(expires_at) WHERE disabled_at IS NULL AND removed_at IS NULL;
                CREATE INDEX standing_trigger_by_creation ON standing_trigger(created_at);
                CREATE TABLE trigger_change (
                    version INTEGER PRIMARY KEY AUTOINCREMENT,
                    trigger_id TEXT NOT NULL,
                    change TEXT NOT NULL,
                    at REAL NOT NULL
                );
                """)
        }
        // What each agent holds, and the captures (#54).
        migrator.registerMigration("triggers-v2") { db in
            try db.execute(sql: """
                CREATE TABLE trigger_set_held (
                    agent_id TEXT PRIMARY KEY NOT NULL,
                    version INTEGER,
                    issued_at_us INTEGER,
                    trigger_ids TEXT NOT NULL DEFAULT '[]',
                    held_at REAL,
                    refused_version INTEGER,
                    refused_issued_at_us INTEGER,
                    refusal TEXT,
                    refused_at REAL
                );
                CREATE TABLE capture (
                    id TEXT PRIMARY KEY NOT NULL,
                    agent_id TEXT NOT NULL,
                    trigger_id TEXT NOT NULL,
                    set_version INTEGER NOT NULL,
                    uid TEXT NOT NULL,
                    since_us INTEGER NOT NULL,
                    until_us INTEGER NOT NULL,
                    matched_at_us INTEGER NOT NULL,
                    crash INTEGER NOT NULL,
                    received_at REAL NOT NULL,
                    status TEXT NOT NULL,
                    detail TEXT NOT NULL DEFAULT '',
                    chunks_received INTEGER NOT NULL DEFAULT 0,
                    chunk_count INTEGER NOT NULL DEFAULT 0,
                    bytes INTEGER NOT NULL DEFAULT 0,
                    records INTEGER NOT NULL DEFAULT 0,
                    files TEXT NOT NULL DEFAULT '[]',
                    error_code INTEGER,
                    removed_at REAL,
                    removed_by TEXT,
                    removed_reason TEXT
                );
                CREATE INDEX capture_by_trigger ON capture(trigger_id, received_at);
                CREATE INDEX capture_by_device ON capture(agent_id, trigger_id, until_us);
                CREATE INDEX capture_by_time ON capture(received_at);
                CREATE INDEX capture_by_agent ON capture(agent_id, received_at);
                """)
        }
    }

    private static let columns = """
        id, definition, maker_scope, created_at, created_by, reason, expires_at, disabled_at, disabled_by, disabled_reason, removed_at, removed_by, removed_reason
        """

    public func create(_ trigger: NewTrigger, inForceAtMost limit: Int) async throws -> Bool {
        let (definition, scope) = try TriggerRows.encoded(trigger)
        let at = trigger.createdAt.timeIntervalSince1970
        return try await db.write { db in
            let inForce = try prepared(
                "SELECT count(*) FROM standing_trigger WHERE disabled_at IS NULL AND removed_at IS NULL AND expires_at > ?",
                [Timestamp(trigger.createdAt).microseconds], as: Int.self
            ).fetchOne(db) ?? 0
            guard inForce < limit else { return false }
            try db.run(
                """
                INSERT INTO standing_trigger (id, definition, maker_scope, uid, created_at, created_by, reason, expires_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [
                    trigger.id, definition.storable, scope.storable, trigger.definition.uid?.storable, at, trigger.createdBy.storable, trigger.reason.storable,
                    trigger.expiresAt.microseconds,
                ])
            try Self.changed(trigger.id, "create", at: at, in: db)
            try AuditRow.chained(at: at, actor: trigger.createdBy, action: AuditAction.trigger.rawValue, detail: trigger.auditDetail, in: db).insert(db)
            return true
        }
    }

    public func trigger(_ id: String) async throws -> TriggerRecord? {
        try await db.read { try Self.trigger(id, in: $0) }
    }

    public func triggers(limit: Int, createdBy: String?) async throws -> [TriggerRecord] {
        try await db.read { db in
            if let createdBy {
                return try prepared(
                    "SELECT \(Self.columns) FROM standing_trigger WHERE removed_at IS NULL AND created_by = ? ORDER BY created_at DESC, id DESC LIMIT ?",
                    [createdBy.storable, max(0, limit)], as: Row.self
                ).fetchAll(db).map(Self.record)
            }
            return try prepared(
                "SELECT \(Self.columns) FROM standing_trigger WHERE removed_at IS NULL ORDER BY created_at DESC, id DESC LIMIT ?", [max(0, limit)], as: Row.self
            ).fetchAll(db).map(Self.record)
        }
    }

    public func disable(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark? {
        try await db.write { db in
            guard let before = try Self.trigger(id, in: db) else { return nil }
            if before.disabled != nil || before.removed != nil { return TriggerMark(trigger: before, isNew: false) }
            let when = at.timeIntervalSince1970
            try db.run("UPDATE standing_trigger SET disabled_at = ?, disabled_by = ?, disabled_reason = ? WHERE id = ?", [when, actor.storable, reason.storable, id])
            try Self.changed(id, "disable", at: when, in: db)
            try AuditRow.chained(at: when, actor: actor, action: AuditAction.triggerDisable.rawValue, detail: TriggerRows.endingDetail(before, reason), in: db).insert(db)
            return TriggerMark(trigger: try Self.trigger(id, in: db) ?? before, isNew: true)
        }
    }

    public func remove(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark? {
        try await db.write { db in
            guard let before = try Self.trigger(id, in: db) else { return nil }
            if before.removed != nil { return TriggerMark(trigger: before, isNew: false) }
            let when = at.timeIntervalSince1970
            try db.run("UPDATE standing_trigger SET removed_at = ?, removed_by = ?, removed_reason = ? WHERE id = ?", [when, actor.storable, reason.storable, id])
            try Self.changed(id, "remove", at: when, in: db)
            try AuditRow.chained(at: when, actor: actor, action: AuditAction.triggerRemove.rawValue, detail: TriggerRows.endingDetail(before, reason), in: db).insert(db)
            return TriggerMark(trigger: try Self.trigger(id, in: db) ?? before, isNew: true)
        }
    }

    public func inForce(now: Timestamp) async throws -> TriggersInForce {
        // One read: the version and the triggers it counts agree.
        try await db.read { db in
            let version = try prepared("SELECT coalesce(max(version), 0) FROM trigger_change", as: Int64.self).fetchOne(db) ?? 0
            let triggers = try prepared(
                "SELECT \(Self.columns) FROM standing_trigger WHERE disabled_at IS NULL AND removed_at IS NULL AND expires_at > ? ORDER BY created_at, id",
                [now.microseconds], as: Row.self
            ).fetchAll(db).map(Self.record)
            return TriggersInForce(version: UInt64(version), triggers: triggers)
        }
    }

    // MARK: The sets devices hold

    public func recordAnswer(_ answer: TriggerSetAnswer) async throws {
        let at = answer.at.timeIntervalSince1970
        let version = Int64(clamping: answer.version)
        try await db.write { db in
            if let refusal = answer.refusal {
                try db.run(
                    """
                    INSERT INTO trigger_set_held (agent_id, refused_version, refused_issued_at_us, refusal, refused_at) VALUES (?, ?, ?, ?, ?)
                    ON CONFLICT (agent_id) DO UPDATE SET refused_version = excluded.refused_version, refused_issued_at_us = excluded.refused_issued_at_us,
                        refusal = excluded.refusal, refused_at = excluded.refused_at
                    WHERE trigger_set_held.issued_at_us IS NULL OR trigger_set_held.issued_at_us <= excluded.refused_issued_at_us
                    """, [answer.agentID, version, answer.issuedAt.microseconds, refusal.storable, at])
            } else {
                try db.run(
                    """
                    INSERT INTO trigger_set_held (agent_id, version, issued_at_us, trigger_ids, held_at) VALUES (?, ?, ?, ?, ?)
                    ON CONFLICT (agent_id) DO UPDATE SET version = excluded.version, issued_at_us = excluded.issued_at_us, trigger_ids = excluded.trigger_ids,
                        held_at = excluded.held_at, refused_version = NULL, refused_issued_at_us = NULL, refusal = NULL, refused_at = NULL
                    WHERE trigger_set_held.issued_at_us IS NULL OR trigger_set_held.issued_at_us <= excluded.issued_at_us
                    """, [answer.agentID, version, answer.issuedAt.microseconds, try TriggerRows.ids(answer.triggerIDs), at])
            }
        }
    }

    public func answer(of agentID: String) async throws -> HeldTriggerSet? {
        try await db.read { db in
            guard
                let row = try prepared(
                    "SELECT version, issued_at_us, trigger_ids, held_at, refused_version, refused_issued_at_us, refusal, refused_at FROM trigger_set_held WHERE agent_id = ?",
                    [agentID], as: Row.self
                ).fetchOne(db)
            else { return nil }
            return try TriggerRows.held(
                agentID: agentID, version: row["version"], issuedAtUs: row["issued_at_us"], triggerIDs: row["trigger_ids"], heldAt: row["held_at"],
                refusedVersion: row["refused_version"], refusedIssuedAtUs: row["refused_issued_at_us"], refusal: row["refusal"], refusedAt: row["refused_at"])
        }
    }

    public func holders(of triggerID: String) async throws -> Int {
        try await db.read { db in
            try prepared(
                "SELECT count(*) FROM trigger_set_held WHERE EXISTS (SELECT 1 FROM json_each(trigger_set_held.trigger_ids) WHERE json_each.value = ?)",
                [triggerID], as: Int.self
            ).fetchOne(db) ?? 0
        }
    }

    // MARK: Captures

    /// The SQL list of final statuses: a capture in one of them never changes again.
    private static let finalStatuses = SQLiteFeedbackInbox.finalStatuses

    private static let captureColumns = """
        id, agent_id, trigger_id, set_version, uid, since_us, until_us, matched_at_us, crash, received_at, status, detail, chunks_received, chunk_count, bytes,
        records, files, error_code, removed_at, removed_by, removed_reason
        """

    public func beginCapture(_ capture: NewCapture, budgets: CaptureBudgets) async throws -> CaptureBegin {
        let at = capture.at.timeIntervalSince1970
        return try await db.write { db in
            if let existing = try Self.capture(capture.id, in: db) { return .existing(existing) }
            let dayAgo = at - TriggerRows.day
            let device = try prepared(
                "SELECT count(*) FROM capture WHERE trigger_id = ? AND agent_id = ? AND received_at > ?", [capture.triggerID, capture.agentID, dayAgo], as: Int.self
            ).fetchOne(db) ?? 0
            let all = try prepared("SELECT count(*) FROM capture WHERE trigger_id = ? AND received_at > ?", [capture.triggerID, dayAgo], as: Int.self).fetchOne(db) ?? 0
            let bytes = try prepared(
                "SELECT coalesce(sum(bytes), 0) FROM capture WHERE agent_id = ? AND received_at > ?", [capture.agentID, dayAgo], as: Int64.self
            ).fetchOne(db) ?? 0
            if let over = TriggerRows.overBudget(capture, device: device, all: all, bytes: bytes, budgets) {
                return .overBudget(over)
            }
            if let other = try prepared(
                "SELECT id FROM capture WHERE agent_id = ? AND trigger_id = ? AND until_us > ? AND since_us < ? LIMIT 1",
                [capture.agentID, capture.triggerID, capture.since.microseconds, capture.until.microseconds], as: String.self
            ).fetchOne(db) {
                return .overlaps(TriggerRows.overlapDetail(other))
            }
            try db.run(
                """
                INSERT INTO capture (id, agent_id, trigger_id, set_version, uid, since_us, until_us, matched_at_us, crash, received_at, status, chunk_count, bytes)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [
                    capture.id, capture.agentID, capture.triggerID, Int64(clamping: capture.setVersion), capture.uid, capture.since.microseconds, capture.until.microseconds,
                    capture.matchedAt.microseconds, capture.crash, at, FeedbackStatus.uploading.rawValue, capture.chunkCount, capture.bytes,
                ])
            return .begun
        }
    }

    public func updateCapture(_ id: String, status: FeedbackStatus, detail: String, chunksReceived: Int?, records: Int?, files: [String]?, errorCode: Int?) async throws
        -> Bool
    {
        let filesJSON = try files.map { try TriggerRows.ids($0) }
        return try await db.write { db in
            try db.run(
                """
                UPDATE capture SET status = ?, detail = ?, chunks_received = coalesce(?, chunks_received), records = coalesce(?, records),
                    files = coalesce(?, files), error_code = coalesce(?, error_code)
                WHERE id = ? AND status NOT IN \(Self.finalStatuses)
                """, [status.rawValue, detail.storable, chunksReceived, records, filesJSON, errorCode, id])
            return db.changesCount > 0
        }
    }

    public func capture(_ id: String) async throws -> CaptureRecord? {
        try await db.read { try Self.capture(id, in: $0) }
    }

    public func captures(of triggerID: String?, limit: Int) async throws -> [CaptureRecord] {
        try await db.read { db in
            if let triggerID {
                return try prepared(
                    "SELECT \(Self.captureColumns) FROM capture WHERE trigger_id = ? ORDER BY received_at DESC, id DESC LIMIT ?", [triggerID, max(0, limit)], as: Row.self
                ).fetchAll(db).map(Self.captureRecord)
            }
            return try prepared("SELECT \(Self.captureColumns) FROM capture ORDER BY received_at DESC, id DESC LIMIT ?", [max(0, limit)], as: Row.self)
                .fetchAll(db).map(Self.captureRecord)
        }
    }

    public func tally(of triggerID: String, since: Date) async throws -> CaptureTally {
        try await db.read { db in
            let row = try prepared(
                "SELECT count(*), count(DISTINCT agent_id) FROM capture WHERE trigger_id = ? AND received_at >= ?", [triggerID, since.timeIntervalSince1970], as: Row.self
            ).fetchOne(db)
            return CaptureTally(captures: row?[0] ?? 0, devices: row?[1] ?? 0)
        }
    }

    public func failAbandonedCaptures(now: Date, after: Duration) async throws -> Int {
        try await db.write { db in
            try db.run(
                "UPDATE capture SET status = 'failed', detail = ? WHERE status NOT IN \(Self.finalStatuses) AND received_at <= ?",
                [TriggerRows.abandoned(after), now.timeIntervalSince1970 - Double(after.components.seconds)])
            return db.changesCount
        }
    }

    public func markCaptureRemoved(_ id: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { db -> RemovalMark? in
            guard let before = try Self.capture(id, in: db) else { return nil }
            if let earlier = before.removed { return RemovalMark(removal: earlier, isNew: false) }
            try db.run("UPDATE capture SET removed_at = ?, removed_by = ?, removed_reason = ? WHERE id = ?", [now.timeIntervalSince1970, actor.storable, reason.storable, id])
            try db.run(
                "UPDATE capture SET status = 'failed', detail = ?, error_code = ? WHERE id = ? AND status NOT IN \(Self.finalStatuses)",
                ["removed by \(actor) before it finished".storable, WireErrorCode.errorUploadInvalid.rawValue, id])
            return RemovalMark(removal: Removal(at: now, by: actor, reason: reason), isNew: true)
        }
    }

    public func removableCaptures(receivedUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { db in
            try prepared(
                """
                SELECT id FROM capture WHERE removed_at IS NULL AND received_at <= ? AND status IN \(Self.finalStatuses) ORDER BY received_at, id LIMIT ?
                """, [cutoff.timeIntervalSince1970, max(limit, 0)], as: String.self
            ).fetchAll(db)
        }
    }

    private static func capture(_ id: String, in db: Database) throws -> CaptureRecord? {
        try prepared("SELECT \(captureColumns) FROM capture WHERE id = ?", [id], as: Row.self).fetchOne(db).map(captureRecord)
    }

    private static func captureRecord(_ row: Row) throws -> CaptureRecord {
        let id: String = row["id"]
        return CaptureRecord(
            id: id, agentID: row["agent_id"], triggerID: row["trigger_id"], setVersion: UInt64(max(0, row["set_version"] as Int64)), uid: row["uid"],
            since: Timestamp(microseconds: row["since_us"]), until: Timestamp(microseconds: row["until_us"]), matchedAt: Timestamp(microseconds: row["matched_at_us"]),
            crash: row["crash"], receivedAt: Date(timeIntervalSince1970: row["received_at"]), status: try TriggerRows.status(row["status"], of: id), detail: row["detail"],
            chunksReceived: row["chunks_received"], chunkCount: row["chunk_count"], bytes: row["bytes"], records: row["records"],
            files: try PullRows.files(row["files"], of: id), errorCode: row["error_code"],
            removed: Removal(at: row["removed_at"], by: row["removed_by"], reason: row["removed_reason"]))
    }

    private static func changed(_ id: String, _ change: String, at: Double, in db: Database) throws {
        try db.run("INSERT INTO trigger_change (trigger_id, change, at) VALUES (?, ?, ?)", [id, change, at])
    }

    private static func trigger(_ id: String, in db: Database) throws -> TriggerRecord? {
        try prepared("SELECT \(columns) FROM standing_trigger WHERE id = ?", [id], as: Row.self).fetchOne(db).map(record)
    }

    private static func record(_ row: Row) throws -> TriggerRecord {
        try TriggerRows.record(
            id: row["id"], definition: row["definition"], scope: row["maker_scope"], createdAt: row["created_at"], createdBy: row["created_by"], reason: row["reason"],
            expiresAt: row["expires_at"], disabled: TriggerRows.ending(at: row["disabled_at"], by: row["disabled_by"], reason: row["disabled_reason"]),
            removed: TriggerRows.ending(at: row["removed_at"], by: row["removed_by"], reason: row["removed_reason"]))
    }
}
