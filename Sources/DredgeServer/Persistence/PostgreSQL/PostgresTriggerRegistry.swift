import DredgeAdminAPI
import DredgeDomain
import DredgeWire
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

    /// What each agent holds, and the captures.
    static let migrationV2: (id: String, statements: [String]) = (
        "triggers-v2",
        [
            """
            CREATE TABLE trigger_set_held (
                agent_id text COLLATE "C" PRIMARY KEY,
                version bigint,
                issued_at_us bigint,
                trigger_ids text NOT NULL DEFAULT '[]',
                held_at double precision,
                refused_version bigint,
                refused_issued_at_us bigint,
                refusal text,
                refused_at double precision
            )
            """,
            """
            CREATE TABLE capture (
                id text COLLATE "C" PRIMARY KEY,
                agent_id text COLLATE "C" NOT NULL,
                trigger_id text COLLATE "C" NOT NULL,
                set_version bigint NOT NULL,
                uid text COLLATE "C" NOT NULL,
                since_us bigint NOT NULL,
                until_us bigint NOT NULL,
                matched_at_us bigint NOT NULL,
                crash boolean NOT NULL,
                received_at double precision NOT NULL,
                status text NOT NULL,
                detail text NOT NULL DEFAULT '',
                chunks_received bigint NOT NULL DEFAULT 0,
                chunk_count bigint NOT NULL DEFAULT 0,
                bytes bigint NOT NULL DEFAULT 0,
                records bigint NOT NULL DEFAULT 0,
                files text NOT NULL DEFAULT '[]',
                error_code bigint,
                removed_at double precision,
                removed_by text,
                removed_reason text
            )
            """,
            "CREATE INDEX capture_by_trigger ON capture (trigger_id, received_at)",
            "CREATE INDEX capture_by_device ON capture (agent_id, trigger_id, until_us)",
            "CREATE INDEX capture_by_time ON capture (received_at)",
            "CREATE INDEX capture_by_agent ON capture (agent_id, received_at)",
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
            try await self.changed(trigger.id, "create", at: at, on: c)
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
            try await self.changed(id, "disable", at: when, on: c)
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
            try await self.changed(id, "remove", at: when, on: c)
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

    // MARK: The sets devices hold

    public func recordAnswer(_ answer: TriggerSetAnswer) async throws {
        let at = answer.at.timeIntervalSince1970
        let version = Int64(clamping: answer.version)
        let ids = try TriggerRows.ids(answer.triggerIDs)
        try await db.write { c in
            if let refusal = answer.refusal {
                try await c.run(
                    """
                    INSERT INTO trigger_set_held (agent_id, refused_version, refused_issued_at_us, refusal, refused_at)
                    VALUES (\(answer.agentID), \(version), \(answer.issuedAt.microseconds), \(refusal.storable), \(at))
                    ON CONFLICT (agent_id) DO UPDATE SET refused_version = excluded.refused_version, refused_issued_at_us = excluded.refused_issued_at_us,
                        refusal = excluded.refusal, refused_at = excluded.refused_at
                    WHERE trigger_set_held.issued_at_us IS NULL OR trigger_set_held.issued_at_us <= excluded.refused_issued_at_us
                    """)
            } else {
                try await c.run(
                    """
                    INSERT INTO trigger_set_held (agent_id, version, issued_at_us, trigger_ids, held_at)
                    VALUES (\(answer.agentID), \(version), \(answer.issuedAt.microseconds), \(ids), \(at))
                    ON CONFLICT (agent_id) DO UPDATE SET version = excluded.version, issued_at_us = excluded.issued_at_us, trigger_ids = excluded.trigger_ids,
                        held_at = excluded.held_at, refused_version = NULL, refused_issued_at_us = NULL, refusal = NULL, refused_at = NULL
                    WHERE trigger_set_held.issued_at_us IS NULL OR trigger_set_held.issued_at_us <= excluded.issued_at_us
                    """)
            }
        }
    }

    public func answer(of agentID: String) async throws -> HeldTriggerSet? {
        try await db.read { c in
            guard
                let row = try await c.rows(
                    """
                    SELECT version, issued_at_us, trigger_ids, held_at, refused_version, refused_issued_at_us, refusal, refused_at FROM trigger_set_held
                    WHERE agent_id = \(agentID)
                    """
                ).first
            else { return nil }
            let (version, issued, ids, heldAt, refusedVersion, refusedIssued, refusal, refusedAt) = try row.decode(
                (Int64?, Int64?, String, Double?, Int64?, Int64?, String?, Double?).self)
            return try TriggerRows.held(
                agentID: agentID, version: version, issuedAtUs: issued, triggerIDs: ids, heldAt: heldAt, refusedVersion: refusedVersion, refusedIssuedAtUs: refusedIssued,
                refusal: refusal, refusedAt: refusedAt)
        }
    }

    public func holders(of triggerID: String) async throws -> Int {
        try await db.read { c in
            Int(try await c.value("SELECT count(*) FROM trigger_set_held WHERE jsonb_exists(trigger_ids::jsonb, \(triggerID))", as: Int64.self) ?? 0)
        }
    }

    // MARK: Captures

    private static let final = FeedbackStatus.allCases.filter(\.isFinal).map(\.rawValue).sorted()

    private static let captureColumns = """
        id, agent_id, trigger_id, set_version, uid, since_us, until_us, matched_at_us, crash, received_at, status, detail, chunks_received, chunk_count, bytes,
        records, files, error_code, removed_at, removed_by, removed_reason
        """

    public func beginCapture(_ capture: NewCapture, budgets: CaptureBudgets) async throws -> CaptureBegin {
        let at = capture.at.timeIntervalSince1970
        return try await db.write { c in
            // One capture of a device, and of a trigger, at a time on every node (the device's
            // lock first, always): the budgets are counted and the capture stored before the
            // next one counts.
            try await c.run("SELECT pg_advisory_xact_lock(hashtextextended(\("agent " + capture.agentID), \(Self.changeLock)))")
            try await c.run("SELECT pg_advisory_xact_lock(hashtextextended(\("trigger " + capture.triggerID), \(Self.changeLock)))")
            if let existing = try await Self.capture(capture.id, on: c) { return .existing(existing) }
            let dayAgo = at - TriggerRows.day
            let device = try await c.value(
                "SELECT count(*) FROM capture WHERE trigger_id = \(capture.triggerID) AND agent_id = \(capture.agentID) AND received_at > \(dayAgo)", as: Int64.self) ?? 0
            let all = try await c.value("SELECT count(*) FROM capture WHERE trigger_id = \(capture.triggerID) AND received_at > \(dayAgo)", as: Int64.self) ?? 0
            let bytes = try await c.value(
                "SELECT coalesce(sum(bytes), 0)::bigint FROM capture WHERE agent_id = \(capture.agentID) AND received_at > \(dayAgo)", as: Int64.self) ?? 0
            if let over = TriggerRows.overBudget(capture, device: Int(device), all: Int(all), bytes: bytes, budgets) {
                return .overBudget(over)
            }
            if let other = try await c.value(
                """
                SELECT id FROM capture WHERE agent_id = \(capture.agentID) AND trigger_id = \(capture.triggerID)
                AND until_us > \(capture.since.microseconds) AND since_us < \(capture.until.microseconds) LIMIT 1
                """, as: String.self)
            {
                return .overlaps(TriggerRows.overlapDetail(other))
            }
            try await c.run(
                """
                INSERT INTO capture (id, agent_id, trigger_id, set_version, uid, since_us, until_us, matched_at_us, crash, received_at, status, chunk_count, bytes)
                VALUES (\(capture.id), \(capture.agentID), \(capture.triggerID), \(Int64(clamping: capture.setVersion)), \(capture.uid), \(capture.since.microseconds),
                    \(capture.until.microseconds), \(capture.matchedAt.microseconds), \(capture.crash), \(at), \(FeedbackStatus.uploading.rawValue),
                    \(Int64(capture.chunkCount)), \(capture.bytes))
                """)
            return .begun
        }
    }

    public func updateCapture(_ id: String, status: FeedbackStatus, detail: String, chunksReceived: Int?, records: Int?, files: [String]?, errorCode: Int?) async throws
        -> Bool
    {
        let filesJSON = try files.map { try TriggerRows.ids($0) }
        return try await db.write { c in
            try await c.run(
                """
                UPDATE capture SET status = \(status.rawValue), detail = \(detail.storable), chunks_received = coalesce(\(chunksReceived.map(Int64.init)), chunks_received),
                    records = coalesce(\(records.map(Int64.init)), records), files = coalesce(\(filesJSON), files),
                    error_code = coalesce(\(errorCode.map(Int64.init)), error_code)
                WHERE id = \(id) AND NOT (status = ANY(\(Self.final)::text[])) RETURNING 1
                """) > 0
        }
    }

    public func capture(_ id: String) async throws -> CaptureRecord? {
        try await db.read { try await Self.capture(id, on: $0) }
    }

    public func captures(of triggerID: String?, limit: Int) async throws -> [CaptureRecord] {
        try await db.read { c in
            if let triggerID {
                return try await c.rows(
                    "SELECT \(unescaped: Self.captureColumns) FROM capture WHERE trigger_id = \(triggerID) ORDER BY received_at DESC, id DESC LIMIT \(max(0, limit))"
                ).map(Self.captureRecord)
            }
            return try await c.rows("SELECT \(unescaped: Self.captureColumns) FROM capture ORDER BY received_at DESC, id DESC LIMIT \(max(0, limit))")
                .map(Self.captureRecord)
        }
    }

    public func tally(of triggerID: String, since: Date) async throws -> CaptureTally {
        try await db.read { c in
            guard
                let row = try await c.rows(
                    "SELECT count(*), count(DISTINCT agent_id) FROM capture WHERE trigger_id = \(triggerID) AND received_at >= \(since.timeIntervalSince1970)"
                ).first
            else { return CaptureTally(captures: 0, devices: 0) }
            let (captures, devices) = try row.decode((Int64, Int64).self)
            return CaptureTally(captures: Int(captures), devices: Int(devices))
        }
    }

    public func failAbandonedCaptures(now: Date, after: Duration) async throws -> Int {
        let cutoff = now.timeIntervalSince1970 - Double(after.components.seconds)
        return try await db.write { c in
            try await c.run(
                """
                UPDATE capture SET status = 'failed', detail = \(TriggerRows.abandoned(after))
                WHERE NOT (status = ANY(\(Self.final)::text[])) AND received_at <= \(cutoff) RETURNING 1
                """)
        }
    }

    public func markCaptureRemoved(_ id: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { c -> RemovalMark? in
            guard let row = try await c.rows("SELECT removed_at, removed_by, removed_reason FROM capture WHERE id = \(id) FOR UPDATE").first else { return nil }
            let (at, by, earlierReason) = try row.decode((Double?, String?, String?).self)
            if let earlier = Removal(at: at, by: by, reason: earlierReason) { return RemovalMark(removal: earlier, isNew: false) }
            try await c.run(
                "UPDATE capture SET removed_at = \(now.timeIntervalSince1970), removed_by = \(actor.storable), removed_reason = \(reason.storable) WHERE id = \(id)")
            try await c.run(
                """
                UPDATE capture SET status = 'failed', detail = \("removed by \(actor) before it finished".storable), error_code = \(Int64(WireErrorCode.errorUploadInvalid.rawValue))
                WHERE id = \(id) AND NOT (status = ANY(\(Self.final)::text[]))
                """)
            return RemovalMark(removal: Removal(at: now, by: actor, reason: reason), isNew: true)
        }
    }

    public func removableCaptures(receivedUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { c in
            try await c.rows(
                """
                SELECT id FROM capture WHERE removed_at IS NULL AND received_at <= \(cutoff.timeIntervalSince1970)
                AND status = ANY(\(Self.final)::text[]) ORDER BY received_at, id LIMIT \(Int64(max(limit, 0)))
                """
            ).map { try $0.decode(String.self) }
        }
    }

    private static func capture(_ id: String, on c: PostgresConnection) async throws -> CaptureRecord? {
        try await c.rows("SELECT \(unescaped: captureColumns) FROM capture WHERE id = \(id)").first.map(captureRecord)
    }

    private static func captureRecord(_ row: PostgresRow) throws -> CaptureRecord {
        let columns = try row.decode(
            (String, String, String, Int64, String, Int64, Int64, Int64, Bool, Double, String, String, Int64, Int64, Int64, Int64, String, Int64?, Double?, String?, String?)
                .self)
        let id = columns.0
        return CaptureRecord(
            id: id, agentID: columns.1, triggerID: columns.2, setVersion: UInt64(max(0, columns.3)), uid: columns.4, since: Timestamp(microseconds: columns.5),
            until: Timestamp(microseconds: columns.6), matchedAt: Timestamp(microseconds: columns.7), crash: columns.8, receivedAt: Date(timeIntervalSince1970: columns.9),
            status: try TriggerRows.status(columns.10, of: id), detail: columns.11, chunksReceived: Int(columns.12), chunkCount: Int(columns.13), bytes: columns.14,
            records: Int(columns.15), files: try PullRows.files(columns.16, of: id), errorCode: columns.17.map { Int($0) },
            removed: Removal(at: columns.18, by: columns.19, reason: columns.20))
    }

    /// Records a change, and tells every node at commit (their connected agents are sent their sets again).
    private func changed(_ id: String, _ change: String, at: Double, on c: PostgresConnection) async throws {
        try await c.run("INSERT INTO trigger_change (trigger_id, change, at) VALUES (\(id), \(change), \(at))")
        try await c.run("SELECT pg_notify(\(PostgresPullQueue.channel(of: db)), \(PullDispatcher.triggersChangedMark))")
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
