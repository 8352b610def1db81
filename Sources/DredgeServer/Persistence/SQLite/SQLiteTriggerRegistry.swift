import DredgeAdminAPI
import DredgeDomain
import Foundation
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
