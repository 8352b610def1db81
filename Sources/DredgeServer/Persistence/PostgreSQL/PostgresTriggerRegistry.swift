import DredgeAdminAPI
import DredgeDomain
import Foundation
import PostgresNIO

/// The standing triggers in the PostgreSQL database (``TriggerRegistry``), the same rules as
/// ``SQLiteTriggerRegistry``, shared by every node. Changes take one advisory lock for the
/// length of their transaction, so versions are given out in the order changes commit: a node
/// that reads version N has every change up to N.
public final class PostgresTriggerRegistry: TriggerRegistry, Sendable {
    private let db: PostgresDatabase

    public init(_ database: PostgresDatabase) { db = database }

    /// Taken by every change, until its transaction ends.
    static let changeLock: Int64 = 7_466_218_402

    /// The schema's steps (``PostgresSchema``).
    static let migration: (id: String, statements: [String]) = (
        "triggers-v1",
        [
            """
            CREATE TABLE standing_trigger (
                id text COLLATE "C" PRIMARY KEY,
                definition text NOT NULL,
                maker_scope text NOT NULL,
                uid text COLLATE "C",
                created_at double precision NOT NULL,
                created_by text COLLATE "C" NOT NULL,
                reason text NOT NULL,
                expires_at bigint NOT NULL,
                disabled_at double precision,
                disabled_by text,
                disabled_reason text,
                removed_at double precision,
                removed_by text,
                removed_reason text
            )
            """,
            "CREATE INDEX standing_trigger_in_force ON standing_trigger (expires_at) WHERE disabled_at IS NULL AND removed_at IS NULL",
            "CREATE INDEX standing_trigger_by_creation ON standing_trigger (created_at)",
            """
            CREATE TABLE trigger_change (
                version bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                trigger_id text COLLATE "C" NOT NULL,
                change text NOT NULL,
                at double precision NOT NULL
            )
            """,
        ]
    )

    private static let columns = """
        id, definition, maker_scope, created_at, created_by, reason, expires_at, disabled_at, disabled_by, disabled_reason, removed_at, removed_by, removed_reason
        """

    public func create(_ trigger: NewTrigger, inForceAtMost limit: Int) async throws -> Bool {
        let (definition, scope) = try TriggerRows.encoded(trigger)
        let at = trigger.createdAt.timeIntervalSince1970
        let createdUs = Timestamp(trigger.createdAt).microseconds
        return try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            try await c.run("SELECT pg_advisory_xact_lock(\(Self.changeLock))")
            // Under the lock every change takes: two creates on two nodes count one after the other.
            let inForce = try await c.value(
                "SELECT count(*) FROM standing_trigger WHERE disabled_at IS NULL AND removed_at IS NULL AND expires_at > \(createdUs)", as: Int64.self) ?? 0
            guard inForce < limit else { return false }
            try await c.run(
                """
                INSERT INTO standing_trigger (id, definition, maker_scope, uid, created_at, created_by, reason, expires_at)
                VALUES (\(trigger.id), \(definition.storable), \(scope.storable), \(trigger.definition.uid?.storable), \(at), \(trigger.createdBy.storable),
                    \(trigger.reason.storable), \(trigger.expiresAt.microseconds))
                """)
            try await Self.changed(trigger.id, "create", at: at, on: c)
            try await PostgresPullQueue.insertAudit(at: at, actor: trigger.createdBy, action: AuditAction.trigger.rawValue, detail: trigger.auditDetail, on: c)
            return true
        }
    }

    public func trigger(_ id: String) async throws -> TriggerRecord? {
        try await db.read { try await Self.trigger(id, on: $0) }
    }

    public func triggers(limit: Int, createdBy: String?) async throws -> [TriggerRecord] {
        try await db.read { c in
            if let createdBy {
                return try await c.rows(
                    """
                    SELECT \(unescaped: Self.columns) FROM standing_trigger WHERE removed_at IS NULL AND created_by = \(createdBy.storable)
                    ORDER BY created_at DESC, id DESC LIMIT \(max(0, limit))
                    """
                ).map(Self.record)
            }
            return try await c.rows("SELECT \(unescaped: Self.columns) FROM standing_trigger WHERE removed_at IS NULL ORDER BY created_at DESC, id DESC LIMIT \(max(0, limit))")
                .map(Self.record)
        }
    }

    public func disable(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark? {
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            try await c.run("SELECT pg_advisory_xact_lock(\(Self.changeLock))")
            guard let before = try await Self.trigger(id, on: c) else { return nil }
            if before.disabled != nil || before.removed != nil { return TriggerMark(trigger: before, isNew: false) }
            let when = at.timeIntervalSince1970
            try await c.run(
                "UPDATE standing_trigger SET disabled_at = \(when), disabled_by = \(actor.storable), disabled_reason = \(reason.storable) WHERE id = \(id)")
            try await Self.changed(id, "disable", at: when, on: c)
            try await PostgresPullQueue.insertAudit(
                at: when, actor: actor, action: AuditAction.triggerDisable.rawValue, detail: TriggerRows.endingDetail(before, reason), on: c)
            return TriggerMark(trigger: try await Self.trigger(id, on: c) ?? before, isNew: true)
        }
    }

    public func remove(_ id: String, by actor: String, reason: String, at: Date) async throws -> TriggerMark? {
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            try await c.run("SELECT pg_advisory_xact_lock(\(Self.changeLock))")
            guard let before = try await Self.trigger(id, on: c) else { return nil }
            if before.removed != nil { return TriggerMark(trigger: before, isNew: false) }
            let when = at.timeIntervalSince1970
            try await c.run(
                "UPDATE standing_trigger SET removed_at = \(when), removed_by = \(actor.storable), removed_reason = \(reason.storable) WHERE id = \(id)")
            try await Self.changed(id, "remove", at: when, on: c)
            try await PostgresPullQueue.insertAudit(
                at: when, actor: actor, action: AuditAction.triggerRemove.rawValue, detail: TriggerRows.endingDetail(before, reason), on: c)
            return TriggerMark(trigger: try await Self.trigger(id, on: c) ?? before, isNew: true)
        }
    }

    public func inForce(now: Timestamp) async throws -> TriggersInForce {
        // Under the change lock, shared: no change commits between the two reads, so the version
        // and the triggers agree.
        try await db.write { c in
            try await c.run("SELECT pg_advisory_xact_lock_shared(\(Self.changeLock))")
            let version = try await c.value("SELECT coalesce(max(version), 0) FROM trigger_change", as: Int64.self) ?? 0
            let triggers = try await c.rows(
                """
                SELECT \(unescaped: Self.columns) FROM standing_trigger
                WHERE disabled_at IS NULL AND removed_at IS NULL AND expires_at > \(now.microseconds) ORDER BY created_at, id
                """
            ).map(Self.record)
            return TriggersInForce(version: UInt64(max(0, version)), triggers: triggers)
        }
    }

    private static func changed(_ id: String, _ change: String, at: Double, on c: PostgresConnection) async throws {
        try await c.run("INSERT INTO trigger_change (trigger_id, change, at) VALUES (\(id), \(change), \(at))")
    }

    private static func trigger(_ id: String, on c: PostgresConnection) async throws -> TriggerRecord? {
        try await c.rows("SELECT \(unescaped: columns) FROM standing_trigger WHERE id = \(id)").first.map(record)
    }

    private static func record(_ row: PostgresRow) throws -> TriggerRecord {
        let (id, definition, scope, createdAt, createdBy, reason, expiresAt, disabledAt, disabledBy, disabledReason, removedAt, removedBy, removedReason) = try row.decode(
            (String, String, String, Double, String, String, Int64, Double?, String?, String?, Double?, String?, String?).self)
        return try TriggerRows.record(
            id: id, definition: definition, scope: scope, createdAt: createdAt, createdBy: createdBy, reason: reason, expiresAt: expiresAt,
            disabled: TriggerRows.ending(at: disabledAt, by: disabledBy, reason: disabledReason), removed: TriggerRows.ending(at: removedAt, by: removedBy, reason: removedReason))
    }
}
