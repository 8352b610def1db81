import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import PostgresNIO

/// The live tails in the PostgreSQL database (``TailRegistry``), the same rules as
/// ``SQLiteTailRegistry``, shared by every node: a part's changes lock its row (`FOR UPDATE`),
/// so two nodes racing on one part (an agent that moved to another node) cannot both move it.
public final class PostgresTailRegistry: TailRegistry, Sendable {
    private let db: PostgresDatabase

    public init(_ database: PostgresDatabase) { db = database }

    /// The schema's steps (``PostgresSchema``).
    static let migration: (id: String, statements: [String]) = (
        "tail-v1",
        [
            """
            CREATE TABLE tail (
                id text COLLATE "C" PRIMARY KEY,
                uid text COLLATE "C" NOT NULL,
                agents text,
                filter text NOT NULL,
                issued_at bigint NOT NULL,
                expires_at bigint NOT NULL,
                records_per_s bigint NOT NULL,
                bytes_per_s bigint NOT NULL,
                is_verbose boolean NOT NULL,
                verbose_types text NOT NULL,
                requested_by text COLLATE "C" NOT NULL,
                reason text NOT NULL,
                created_at double precision NOT NULL,
                stopped_at double precision,
                stopped_by text,
                stop_reason text,
                removed_at double precision,
                removed_by text,
                removed_reason text
            )
            """,
            "CREATE INDEX tail_open ON tail (expires_at) WHERE stopped_at IS NULL",
            "CREATE INDEX tail_by_creation ON tail (created_at)",
            "CREATE INDEX tail_kept ON tail (stopped_at) WHERE removed_at IS NULL",
            """
            CREATE TABLE tail_part (
                tail_id text COLLATE "C" NOT NULL REFERENCES tail(id),
                agent_id text COLLATE "C" NOT NULL,
                status text NOT NULL,
                detail text NOT NULL DEFAULT '',
                wrapped_key bytea,
                start_cursor bigint,
                held_seq bigint NOT NULL DEFAULT 0,
                held_cursor bigint NOT NULL DEFAULT 0,
                records bigint NOT NULL DEFAULT 0,
                dropped bigint NOT NULL DEFAULT 0,
                bytes bigint NOT NULL DEFAULT 0,
                updated_at double precision NOT NULL,
                PRIMARY KEY (tail_id, agent_id)
            )
            """,
        ]
    )

    private static let open = [TailPartStatus.delivered.rawValue, TailPartStatus.running.rawValue]
    private static let columns = """
        id, uid, agents, filter, issued_at, expires_at, records_per_s, bytes_per_s, is_verbose, verbose_types, requested_by, reason, created_at, stopped_at, stopped_by, stop_reason,
        removed_at, removed_by, removed_reason, urgent
        """

    public func create(_ tail: NewTail) async throws {
        let (filter, agents, verboseTypes) = try TailRows.encoded(tail)
        let now = Date().timeIntervalSince1970
        let detail = tail.auditDetail
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            try await c.run(
                """
                INSERT INTO tail (id, uid, agents, filter, issued_at, expires_at, records_per_s, bytes_per_s, is_verbose, verbose_types, requested_by, reason, created_at, urgent)
                VALUES (\(tail.id), \(tail.uid), \(agents?.storable), \(filter.storable), \(tail.issuedAt.microseconds), \(tail.expiresAt.microseconds),
                    \(Int64(tail.recordsPerSecond)), \(TailRows.stored(tail.bytesPerSecond)), \(tail.verbose), \(verboseTypes.storable), \(tail.requestedBy.storable),
                    \(tail.reason.storable), \(now), \(tail.urgent))
                """)
            try await PostgresPullQueue.insertAudit(at: now, actor: tail.requestedBy, action: AuditAction.tail.rawValue, detail: detail, on: c)
            // Every node wakes the holders connected to it (on the pull channel, at commit): the
            // first 200 holders; the others are sent it at their next connection or new uid.
            try await c.run(
                """
                SELECT pg_notify(\(PostgresPullQueue.channel(of: db)), string_agg(agent_id, ',')) FROM (
                    SELECT agent_id FROM agent_uid WHERE uid = \(tail.uid) UNION SELECT agent_id FROM agent_user WHERE uid = \(tail.uid) LIMIT 200
                ) AS holders HAVING count(*) > 0
                """)
        }
    }

    public func tail(_ id: String) async throws -> TailRecord? {
        try await db.read { try await Self.tail(id, on: $0) }
    }

    public func tails(limit: Int) async throws -> [TailRecord] {
        try await db.read { c in
            var tails: [TailRecord] = []
            for row in try await c.rows("SELECT \(unescaped: Self.columns) FROM tail ORDER BY created_at DESC, id DESC LIMIT \(max(0, limit))") {
                tails.append(try await Self.record(row, on: c))
            }
            return tails
        }
    }

    public func due(for agentID: String, uids: Set<String>, now: Timestamp) async throws -> [DueTail] {
        guard !uids.isEmpty else { return [] }
        return try await db.read { c in
            var due: [DueTail] = []
            let rows = try await c.rows("SELECT \(unescaped: Self.columns) FROM tail WHERE stopped_at IS NULL AND expires_at > \(now.microseconds) ORDER BY created_at, id")
            // The open tails are few: match the agent's uids (maybe thousands) in memory.
            for row in rows where uids.contains(try row.makeRandomAccess()[1].decode(String.self, context: .default)) {
                let tail = try await Self.record(row, on: c)
                if let agents = tail.agents, !agents.contains(agentID) { continue }
                let part = try await c.rows("SELECT status, wrapped_key FROM tail_part WHERE tail_id = \(tail.id) AND agent_id = \(agentID)").first
                    .map { try $0.decode((String, ByteBuffer?).self) }
                if let part, try TailRows.status(part.0, of: tail.id).isFinal { continue }
                due.append(DueTail(tail: tail, wrappedKey: part?.1.map { Array($0.readableBytesView) }))
            }
            return due
        }
    }

    public func deliver(_ tailID: String, agent: String, wrappedKey: [UInt8], at: Date) async throws -> [UInt8]? {
        try await db.write { c in
            guard
                let (expiresAt, stoppedAt) = try await c.rows("SELECT expires_at, stopped_at FROM tail WHERE id = \(tailID) FOR SHARE").first?.decode((Int64, Double?).self),
                stoppedAt == nil, expiresAt > Timestamp(at).microseconds
            else { return nil }
            try await c.run(
                """
                INSERT INTO tail_part (tail_id, agent_id, status, wrapped_key, updated_at)
                VALUES (\(tailID), \(agent), \(TailPartStatus.delivered.rawValue), \(ByteBuffer(bytes: wrappedKey)), \(at.timeIntervalSince1970))
                ON CONFLICT (tail_id, agent_id) DO NOTHING
                """)
            guard let (status, key) = try await c.rows("SELECT status, wrapped_key FROM tail_part WHERE tail_id = \(tailID) AND agent_id = \(agent)").first?
                .decode((String, ByteBuffer?).self), try !TailRows.status(status, of: tailID).isFinal, let key
            else { return nil }
            return Array(key.readableBytesView)
        }
    }

    public func accepted(_ tailID: String, agent: String, startCursor: UInt64, at: Date) async throws -> TailHold? {
        try await db.write { c in
            guard let (tail, part) = try await Self.takingPart(tailID, agent: agent, at: at, on: c) else { return nil }
            let cursor = part.seq == 0 && part.start == nil ? startCursor : part.cursor
            try await c.run(
                """
                UPDATE tail_part SET status = \(TailPartStatus.running.rawValue), start_cursor = coalesce(start_cursor, \(TailRows.stored(startCursor))),
                    held_cursor = \(TailRows.stored(cursor)), updated_at = \(at.timeIntervalSince1970)
                WHERE tail_id = \(tailID) AND agent_id = \(agent)
                """)
            return TailHold(uid: tail.uid, expiresAt: tail.expiresAt, wrappedKey: part.key, seq: part.seq, cursor: cursor, bytes: part.bytes)
        }
    }

    public func hold(_ tailID: String, agent: String, at: Date) async throws -> TailHold? {
        // In a transaction of its own: takingPart locks the row, until this read ends.
        try await db.write { c in
            guard let (tail, part) = try await Self.takingPart(tailID, agent: agent, at: at, on: c), part.running else { return nil }
            return TailHold(uid: tail.uid, expiresAt: tail.expiresAt, wrappedKey: part.key, seq: part.seq, cursor: part.cursor, bytes: part.bytes)
        }
    }

    public func held(_ tailID: String, agent: String, seq: UInt64, cursor: UInt64, records: Int, dropped: UInt64, bytes: Int64, at: Date) async throws -> Bool {
        try await db.write { c in
            guard let (_, part) = try await Self.takingPart(tailID, agent: agent, at: at, on: c), part.running, part.seq &+ 1 == seq, cursor > part.cursor else {
                return false
            }
            try await c.run(
                """
                UPDATE tail_part SET held_seq = \(TailRows.stored(seq)), held_cursor = \(TailRows.stored(cursor)), records = records + \(Int64(records)),
                    dropped = dropped + \(TailRows.stored(dropped)), bytes = \(bytes), updated_at = \(at.timeIntervalSince1970)
                WHERE tail_id = \(tailID) AND agent_id = \(agent)
                """)
            return true
        }
    }

    public func endPart(_ tailID: String, agent: String, status: TailPartStatus, detail: String, at: Date) async throws -> Bool {
        guard status.isFinal else { throw DeploymentError("a tail's part ends as rejected or ended, not \(status.rawValue)") }
        return try await db.write { c in
            try await c.run(
                """
                UPDATE tail_part SET status = \(status.rawValue), detail = \(detail.storable), wrapped_key = NULL, updated_at = \(at.timeIntervalSince1970)
                WHERE tail_id = \(tailID) AND agent_id = \(agent) AND status = ANY(\(Self.open)) RETURNING 1
                """) > 0
        }
    }

    public func stop(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> TailStopMark? {
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            let mark = try await Self.stop(tailID, by: actor, reason: reason, at: at, on: c)
            // Every node tells the devices connected to it, and ends its watchers.
            if mark?.isNew == true { try await c.run("SELECT pg_notify(\(PostgresPullQueue.channel(of: db)), \(PullDispatcher.tailStoppedMark + tailID))") }
            return mark
        }
    }

    public func stopExpired(now: Timestamp) async throws -> [String] {
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            let ids = try await c.rows("SELECT id FROM tail WHERE stopped_at IS NULL AND expires_at <= \(now.microseconds - TailRows.grace) ORDER BY expires_at, id FOR UPDATE")
                .map { try $0.decode(String.self) }
            var stopped: [String] = []
            for id in ids where try await Self.stop(id, by: TailRows.server, reason: "expired", at: now.date, on: c)?.isNew == true {
                stopped.append(id)
                try await c.run("SELECT pg_notify(\(PostgresPullQueue.channel(of: db)), \(PullDispatcher.tailStoppedMark + id))")
            }
            return stopped
        }
    }

    public func openCount(requestedBy: String?, now: Timestamp) async throws -> Int {
        try await db.read { c in
            let count: Int64?
            if let requestedBy {
                count = try await c.value(
                    "SELECT count(*) FROM tail WHERE stopped_at IS NULL AND expires_at > \(now.microseconds) AND requested_by = \(requestedBy.storable)", as: Int64.self)
            } else {
                count = try await c.value("SELECT count(*) FROM tail WHERE stopped_at IS NULL AND expires_at > \(now.microseconds)", as: Int64.self)
            }
            return Int(count ?? 0)
        }
    }

    public func markRemoved(_ tailID: String, by actor: String, reason: String, at: Date) async throws -> RemovalMark? {
        try await db.write { c in
            try await PostgresPullQueue.auditTransaction(c)
            guard try await c.run("SELECT 1 FROM tail WHERE id = \(tailID) FOR UPDATE") > 0, let tail = try await Self.tail(tailID, on: c) else { return nil }
            if let earlier = tail.removed { return RemovalMark(removal: earlier, isNew: false) }
            if tail.stopped == nil,
                try await Self.stop(tailID, by: actor, reason: "its records were removed" + (reason.isEmpty ? "" : ": \(reason)"), at: at, on: c)?.isNew == true
            {
                try await c.run("SELECT pg_notify(\(PostgresPullQueue.channel(of: db)), \(PullDispatcher.tailStoppedMark + tailID))")
            }
            try await c.run(
                "UPDATE tail SET removed_at = \(at.timeIntervalSince1970), removed_by = \(actor.storable), removed_reason = \(reason.storable) WHERE id = \(tailID)")
            return RemovalMark(removal: Removal(at: at, by: actor, reason: reason), isNew: true)
        }
    }

    public func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { c in
            try await c.rows(
                """
                SELECT id FROM tail WHERE removed_at IS NULL AND stopped_at IS NOT NULL AND stopped_at <= \(cutoff.timeIntervalSince1970)
                ORDER BY stopped_at, id LIMIT \(max(0, limit))
                """
            ).map { try $0.decode(String.self) }
        }
    }

    // MARK: Rows

    private static func stop(_ tailID: String, by actor: String, reason: String, at: Date, on c: PostgresConnection) async throws -> TailStopMark? {
        // The row locked first: two stops of one tail take turns, and the second sees the first.
        guard try await c.run("SELECT 1 FROM tail WHERE id = \(tailID) FOR UPDATE") > 0, let before = try await tail(tailID, on: c) else { return nil }
        if before.stopped != nil { return TailStopMark(tail: before, isNew: false) }
        let when = at.timeIntervalSince1970
        try await c.run("UPDATE tail SET stopped_at = \(when), stopped_by = \(actor.storable), stop_reason = \(reason.storable) WHERE id = \(tailID)")
        try await c.run(
            """
            UPDATE tail_part SET status = \(TailPartStatus.ended.rawValue), detail = \(TailRows.stoppedDetail(reason).storable), wrapped_key = NULL, updated_at = \(when)
            WHERE tail_id = \(tailID) AND status = ANY(\(Self.open))
            """)
        guard let after = try await tail(tailID, on: c) else { return nil }
        try await PostgresPullQueue.insertAudit(
            at: when, actor: actor, action: AuditAction.tailStop.rawValue, detail: after.stopDetail(by: actor, reason: reason, at: at), on: c)
        return TailStopMark(tail: after, isNew: true)
    }

    /// As ``SQLiteTailRegistry``'s: the tail open at `at` (grace included), the part delivered
    /// or running, its row locked for the transaction.
    private static func takingPart(_ tailID: String, agent: String, at: Date, on c: PostgresConnection) async throws -> (TailRecord, TailRows.Part)? {
        guard
            let row = try await c.rows(
                """
                SELECT status, start_cursor, held_seq, held_cursor, bytes, wrapped_key FROM tail_part WHERE tail_id = \(tailID) AND agent_id = \(agent) FOR UPDATE
                """
            ).first,
            let tail = try await tail(tailID, on: c), tail.stopped == nil, Timestamp(at).microseconds <= TailRows.lastTaken(tail.expiresAt.microseconds)
        else { return nil }
        let (status, start, seq, cursor, bytes, key) = try row.decode((String, Int64?, Int64, Int64, Int64, ByteBuffer?).self)
        guard let key, try !TailRows.status(status, of: tailID).isFinal else { return nil }
        return (
            tail,
            TailRows.Part(
                running: status == TailPartStatus.running.rawValue, start: start.map(TailRows.read), seq: TailRows.read(seq), cursor: TailRows.read(cursor), bytes: bytes,
                key: Array(key.readableBytesView))
        )
    }

    private static func tail(_ id: String, on c: PostgresConnection) async throws -> TailRecord? {
        guard let row = try await c.rows("SELECT \(unescaped: columns) FROM tail WHERE id = \(id)").first else { return nil }
        return try await record(row, on: c)
    }

    private static func record(_ row: PostgresRow, on c: PostgresConnection) async throws -> TailRecord {
        let (id, uid, agents, filter, issuedAt, expiresAt, recordsPerSecond, bytesPerSecond, verbose, verboseTypes, requestedBy, reason, createdAt, stoppedAt, stoppedBy,
            stopReason, removedAt, removedBy, removedReason, urgent) = try row.decode(
                (String, String, String?, String, Int64, Int64, Int64, Int64, Bool, String, String, String, Double, Double?, String?, String?, Double?, String?, String?, Bool).self)
        var parts: [TailPart] = []
        for p in try await c.rows(
            """
            SELECT agent_id, status, detail, start_cursor, held_seq, held_cursor, records, dropped, bytes, updated_at FROM tail_part WHERE tail_id = \(id) ORDER BY agent_id
            """)
        {
            let (agent, status, detail, start, seq, cursor, records, dropped, bytes, updatedAt) =
                try p.decode((String, String, String, Int64?, Int64, Int64, Int64, Int64, Int64, Double).self)
            parts.append(
                TailPart(
                    agentID: agent, status: try TailRows.status(status, of: id), detail: detail, startCursor: start.map(TailRows.read), heldSeq: TailRows.read(seq),
                    heldCursor: TailRows.read(cursor), records: records, dropped: dropped, bytes: bytes, updatedAt: Date(timeIntervalSince1970: updatedAt)))
        }
        return TailRecord(
            id: id, uid: uid, agents: try agents.map { try TailRows.strings($0, of: id, "devices") }, filter: try TailRows.filter(filter, of: id),
            issuedAt: Timestamp(microseconds: issuedAt), expiresAt: Timestamp(microseconds: expiresAt), recordsPerSecond: UInt32(clamping: recordsPerSecond),
            bytesPerSecond: TailRows.read(bytesPerSecond), verbose: verbose, verboseTypes: try TailRows.strings(verboseTypes, of: id, "verbose types"),
            requestedBy: requestedBy, reason: reason.isEmpty ? nil : reason, createdAt: Date(timeIntervalSince1970: createdAt),
            stopped: stoppedAt.map { TailStopping(at: Date(timeIntervalSince1970: $0), by: stoppedBy ?? "", reason: stopReason ?? "") }, parts: parts,
            removed: Removal(at: removedAt, by: removedBy, reason: removedReason), urgent: urgent)
    }
}
