import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import GRDB

/// The pull queue and audit log in the server's database (``PullQueue``, ``AuditLog``): every
/// pull, who asked for it, its wrapped key and its status per agent.
///
/// A pull is created `queued` for each target agent; it becomes `delivered` when sent,
/// `exporting`/`uploading` as the agent reports, then `complete`, or `rejected` / `failed` /
/// `expired` with the reason. Rows survive server restarts, so a pull for an offline agent is
/// delivered when it connects, unless it expired first. The per-pull AES key is kept wrapped
/// under the server's encryption key; ``CommandIssuer`` makes and unwraps it, never this store.
public final class SQLitePullQueue: PullQueue, AuditLog, Sendable {
    public typealias Status = PullStatus
    public typealias Target = PullTarget
    public typealias Pull = PullRecord
    public typealias UnreadablePull = DredgeServer.UnreadablePull

    let db: DatabasePool

    public init(_ database: ServerDatabase) { db = database.pool }

    /// The `pull`, `pull_target` and `audit` tables as they were when `pulls.sqlite` was
    /// merged into the one database.
    static func legacySchema(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("pulls-v1") { db in
            try db.execute(sql: """
                CREATE TABLE pull (
                    id TEXT PRIMARY KEY NOT NULL,
                    uid TEXT NOT NULL,
                    agent_id TEXT NOT NULL,
                    filter TEXT NOT NULL,
                    issued_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    wrapped_key BLOB NOT NULL,
                    requested_by TEXT NOT NULL,
                    created_at REAL NOT NULL
                );
                CREATE TABLE pull_target (
                    pull_id TEXT NOT NULL REFERENCES pull(id),
                    agent_id TEXT NOT NULL,
                    status TEXT NOT NULL,
                    detail TEXT NOT NULL DEFAULT '',
                    chunks_received INTEGER NOT NULL DEFAULT 0,
                    chunk_count INTEGER NOT NULL DEFAULT 0,
                    bytes INTEGER NOT NULL DEFAULT 0,
                    files TEXT NOT NULL DEFAULT '[]',
                    updated_at REAL NOT NULL,
                    PRIMARY KEY (pull_id, agent_id)
                );
                CREATE INDEX pull_target_by_agent ON pull_target(agent_id, status);
                CREATE TABLE audit (
                    id INTEGER PRIMARY KEY,
                    at REAL NOT NULL,
                    actor TEXT NOT NULL,
                    action TEXT NOT NULL,
                    detail TEXT NOT NULL
                );
                """)
        }
        // The delivery pass looks for queued targets across all agents.
        migrator.registerMigration("pulls-v2") { db in
            try db.execute(sql: "CREATE INDEX pull_target_by_status ON pull_target(status, agent_id)")
        }
        // Filters were stored as the synthesized JSON of the filter type, without a version;
        // rewrite each in the versioned form (StoredFilter). A row that does not read as the
        // old form is left as it is: it fails to read back and its pull fails, closed.
        migrator.registerMigration("pulls-v3-stored-filter") { db in
            for row in try Row.fetchAll(db, sql: "SELECT id, filter FROM pull") {
                let old: String = row["filter"]
                let legacy: LogFilter
                do {
                    legacy = try JSONDecoder().decode(LogFilter.self, from: Data(old.utf8))
                } catch {
                    continue
                }
                guard legacy.problem == nil else { continue }
                try db.execute(sql: "UPDATE pull SET filter = ? WHERE id = ?", arguments: [try StoredFilter.encode(legacy), row["id"] as String])
            }
        }
    }

    /// Migrations after the one database.
    static func schema(_ migrator: inout DatabaseMigrator) {
        // Agents that come to hold a uid join the open pulls by that uid alone.
        migrator.registerMigration("pulls-v4-by-uid") { db in
            // By expiry first: the open ones are a short range at the end, however many old pulls there are.
            try db.execute(sql: "CREATE INDEX pull_open_by_uid ON pull(expires_at, uid) WHERE agent_id = ''")
        }
        // A pull's reason (a ticket) is part of the pull, shown and searched; before, it was
        // only in the audit entry (pulls made before this keep theirs there alone).
        migrator.registerMigration("pulls-v5-reason") { db in
            try db.execute(sql: "ALTER TABLE pull ADD COLUMN reason TEXT NOT NULL DEFAULT ''")
        }
    }

    public func adopt(agent: String, uids: Set<String>, now: Timestamp) async throws -> [String] {
        guard !uids.isEmpty else { return [] }
        let at = now.date.timeIntervalSince1970
        // The unexpired pulls by uid alone are few (a range of the partial index); the agent's
        // uids may be thousands: match in memory, not one query per uid.
        let open = try await db.read { db in
            try prepared(
                """
                SELECT id, uid FROM pull WHERE agent_id = '' AND expires_at > ? AND uid != '' AND removed_at IS NULL AND scope IS NULL
                AND NOT EXISTS (SELECT 1 FROM pull_target t WHERE t.pull_id = pull.id AND t.agent_id = ?)
                ORDER BY created_at, id
                """,
                [now.microseconds, agent], as: Row.self
            ).fetchAll(db).compactMap { row -> (id: String, uid: String)? in
                guard let id = row["id"] as String?, let uid = row["uid"] as String? else { return nil }
                return (id, uid)
            }
        }
        let wanted = Set(uids.filter(UserID.isValid).map { Array($0.utf8) })
        let matching = open.filter { wanted.contains(Array($0.uid.utf8)) }
        guard !matching.isEmpty else { return [] }
        return try await db.write { db in
            var adopted: [String] = []
            for pull in matching {
                // Not a pull removed since the read.
                try db.run(
                    "INSERT OR IGNORE INTO pull_target (pull_id, agent_id, status, updated_at) SELECT ?, ?, ?, ? FROM pull WHERE id = ? AND removed_at IS NULL",
                    [pull.id, agent, Status.queued.rawValue, at, pull.id])
                if db.changesCount > 0 { adopted.append(pull.id) }
            }
            return adopted
        }
    }

    /// Queues a pull (made by ``CommandIssuer/newPull(uid:agentID:filter:targets:lifetime:requestedBy:now:)``)
    /// for its targets and records who asked, in the audit log, in one transaction.
    public func create(_ pull: NewPull) async throws {
        if let problem = pull.filter.problem { throw DeploymentError(problem) }
        let filterJSON = try StoredFilter.encode(pull.filter)
        let now = Date().timeIntervalSince1970
        try await db.write { db in
            try PullRow(
                id: pull.id, uid: pull.uid, agentId: pull.agentID, filter: filterJSON, issuedAt: pull.issuedAt.microseconds, expiresAt: pull.expiresAt.microseconds,
                wrappedKey: Data(pull.wrappedKey), requestedBy: pull.requestedBy, reason: pull.reason, createdAt: now, scope: pull.scope,
                approvalRequired: pull.approvalRequired, urgent: pull.urgent
            ).insert(db)
            for agent in pull.targets {
                try PullTargetRow(pullId: pull.id, agentId: agent, status: Status.queued.rawValue, updatedAt: now).insert(db)
            }
            try AuditRow.chained(at: now, actor: pull.requestedBy, action: AuditAction.pull.rawValue, detail: pull.auditDetail, in: db).insert(db)
        }
    }

    public func wrappedKey(of pullID: String) async throws -> [UInt8]? {
        try await db.read { try Self.row(pullID, in: $0) }.map { Array($0.wrappedKey) }
    }

    /// The pulls to send `agentID` now, each with its stored form: the queued ones, and with
    /// `includingUnanswered` (when the agent has just connected) the ones delivered before that
    /// it never answered. Queued ones past their expiry are expired first. It runs whenever an
    /// agent connects or is woken, so it only reads (one transaction) unless a queued pull has
    /// expired.
    public func deliverable(for agentID: String, includingUnanswered: Bool, now: Timestamp) async throws -> [DuePull] {
        let statuses = PullTargetLife.sqlList(PullTargetLife.deliverable(includingUnanswered: includingUnanswered))
        let (queued, due) = try await db.read { db in
            let queued = try prepared(
                """
                SELECT t.pull_id, t.agent_id, t.status, t.updated_at, p.expires_at FROM pull_target t JOIN pull p ON p.id = t.pull_id
                WHERE t.agent_id = ? AND t.status IN \(statuses) AND (p.approval_required = 0 OR p.approved_at IS NOT NULL) ORDER BY p.created_at, t.pull_id
                """,
                [agentID], as: OpenTarget.self
            ).fetchAll(db)
            let due = try queued.filter { PullTargetLife.isSent(expiresAt: Timestamp(microseconds: $0.expiresAt), now: now) }.map { DuePull(id: $0.pullId, stored: try Self.storedPull($0.pullId, in: db)) }
            return (queued, due)
        }
        let expired = try queued.filter {
            PullTargetLife.expiredBeforeDelivery(try PullRows.status($0.status, of: $0.pullId), expiresAt: Timestamp(microseconds: $0.expiresAt), now: now)
        }.map(\.pullId)
        if !expired.isEmpty {
            let move = PullTargetLife.expireBeforeDelivery
            try await db.write { db in
                for id in expired {
                    try db.run(
                        "UPDATE pull_target SET status = ?, detail = ?, updated_at = ? WHERE pull_id = ? AND agent_id = ? AND status IN \(PullTargetLife.sqlList(move.from))",
                        [move.to.rawValue, PullTargetLife.expiredBeforeDeliveryDetail, Date().timeIntervalSince1970, id, agentID])
                }
            }
        }
        return due
    }

    /// A target still open, with its pull's expiry (the delivery and deadline passes read these).
    struct OpenTarget: SnakeCaseRow {
        var pullId: String
        var agentId: String
        var status: String
        var updatedAt: Double
        var expiresAt: Int64
    }

    /// Ends the targets that will not finish: delivered, exporting or uploading past the pull's
    /// expiry with nothing heard for `quietAfterExpiry` (an agent gone for good, an export that
    /// never reported), or still open `afterExpiry` past it. They become `expired`, with the
    /// reason. Returns how many. (Queued ones expire at their expiry: ``deliverable(for:includingUnanswered:now:)``.)
    ///
    /// - Parameter listeningSince: when this server started listening: silence before it is
    ///   the server's own downtime, not the agent's, so it never counts.
    @discardableResult
    public func expireStalled(
        now: Date = Date(), listeningSince: Date = .distantPast, deadlines: PullTargetLife.Deadlines = PullTargetLife.Deadlines()
    ) async throws -> Int {
        let stall = PullTargetLife.stall
        let open = try await db.read { db in
            try OpenTarget.fetchAll(
                db,
                sql: """
                    SELECT t.pull_id, t.agent_id, t.status, t.updated_at, p.expires_at FROM pull_target t JOIN pull p ON p.id = t.pull_id
                    WHERE t.status IN \(PullTargetLife.sqlList(stall.from)) AND p.expires_at <= ?
                    """,
                arguments: [Timestamp(now).microseconds])
        }
        var ended = 0
        for row in open {
            let status = try PullRows.status(row.status, of: row.pullId)
            guard
                let detail = deadlines.ending(
                    status, heard: Timestamp(Date(timeIntervalSince1970: row.updatedAt)), expiresAt: Timestamp(microseconds: row.expiresAt),
                    now: Timestamp(now), listeningSince: PullRows.listening(since: listeningSince))
            else { continue }
            ended += try await db.write { db in
                // Guarded by the status it was read in: a target that moved meanwhile is left alone.
                try db.execute(
                    sql: "UPDATE pull_target SET status = ?, detail = ?, updated_at = ? WHERE pull_id = ? AND agent_id = ? AND status = ?",
                    arguments: [stall.to.rawValue, detail, now.timeIntervalSince1970, row.pullId, row.agentId, status.rawValue])
                return db.changesCount
            }
        }
        return ended
    }

    /// Agents with a queued pull: what the delivery pass wakes (it also catches pulls queued by
    /// another process, such as `dredge-server pull`).
    public func agentsWithQueuedPulls() async throws -> Set<String> {
        try await db.read { Set(try String.fetchAll($0, sql: "SELECT DISTINCT agent_id FROM pull_target WHERE status = ?", arguments: [PullStatus.queued.rawValue])) }
    }

    /// The audit log, newest first.
    public func audit(_ query: AuditQuery) async throws -> [AuditEntry] {
        try await db.read { db in
            var request = AuditRow.order(Column("id").desc).limit(min(max(query.limit, 1), 10_000))
            if let since = query.since { request = request.filter(Column("at") >= since.timeIntervalSince1970) }
            if let actor = query.actor { request = request.filter(Column("actor") == actor) }
            // An action of the log is itself only ("pull" is pulls made, not their downloads);
            // any other name is a group, finding the actions under it: "token" finds
            // "token.create" (byte order: "." < "/").
            if let action = query.action {
                request = request.filter(
                    AuditQuery.isExact(action) ? Column("action") == action : Column("action") == action || (Column("action") > action + "." && Column("action") < action + "/"))
            }
            if let before = query.before { request = request.filter(Column("id") < before) }
            return try request.fetchAll(db).map {
                AuditEntry(id: $0.id, at: Date(timeIntervalSince1970: $0.at), actor: $0.actor, action: $0.action, detail: $0.detail)
            }
        }
    }


    /// Records an administrative action other than a pull (token changes).
    public func record(actor: String, action: String, detail: String, at: Date) async throws {
        try await db.write { db in
            try AuditRow.chained(at: at.timeIntervalSince1970, actor: actor, action: action, detail: detail, in: db).insert(db)
        }
    }

    public func chainEntries(after: Int64, limit: Int) async throws -> [AuditChain.Stored] {
        try await db.read { db in
            // Cast to what the chain hashes: a row edited to another type (SQLite allows it)
            // reads as an entry that does not hash, a break, never as a failure to read.
            try Row.fetchAll(
                db,
                sql: """
                    SELECT id, CAST(at AS REAL) AS at, CAST(actor AS TEXT) AS actor, CAST(action AS TEXT) AS action, CAST(detail AS TEXT) AS detail,
                        CASE WHEN typeof(hash) = 'blob' THEN hash END AS hash
                    FROM audit WHERE id > ? ORDER BY id LIMIT ?
                    """, arguments: [after, max(limit, 0)]
            ).map { row in
                AuditChain.Stored(
                    id: row["id"], at: row["at"] ?? 0, actor: row["actor"] ?? "", action: row["action"] ?? "", detail: row["detail"] ?? "", hash: (row["hash"] as Data?).map(Array.init))
            }
        }
    }

    public func pull(_ id: String, now: Timestamp) async throws -> Pull? {
        try await db.read { try Self.pull(id, now: now, in: $0) }
    }

    private static func pull(_ id: String, now: Timestamp, in db: Database) throws -> Pull? {
        guard let row = try Self.row(id, in: db) else { return nil }
        let targets = try prepared("SELECT * FROM pull_target WHERE pull_id = ? ORDER BY agent_id", [id], as: PullTargetRow.self).fetchAll(db).map { t in
            // A queued pull past its expiry is expired even if no delivery pass marked it yet.
            let (status, detail) = PullTargetLife.shown(
                try PullRows.status(t.status, of: id), detail: t.detail, expiresAt: Timestamp(microseconds: row.expiresAt), now: now)
            return Target(
                pullID: t.pullId, agentID: t.agentId, status: status, detail: detail,
                chunksReceived: t.chunksReceived, chunkCount: t.chunkCount, bytes: t.bytes, files: try PullRows.files(t.files, of: id),
                updatedAt: Date(timeIntervalSince1970: t.updatedAt), errorCode: t.errorCode)
        }
        return Pull(
            id: row.id, uid: row.uid, agentID: row.agentId, filter: PullRows.shownFilter(row.filter),
            issuedAt: Timestamp(microseconds: row.issuedAt), expiresAt: Timestamp(microseconds: row.expiresAt),
            requestedBy: row.requestedBy, reason: row.reason.isEmpty ? nil : row.reason, targets: targets,
            removed: Removal(at: row.removedAt, by: row.removedBy, reason: row.removedReason),
            approval: row.approvalRequired ? PullApproval(approvedBy: row.approvedBy, approvedAt: row.approvedAt.map(Date.init(timeIntervalSince1970:))) : nil,
            scope: try AccessScope.stored(row.scope, of: "pull \(id)"), urgent: row.urgent)
    }

    public func approve(_ pullID: String, by approver: String, now: Timestamp) async throws -> PullRecord? {
        let at = now.date.timeIntervalSince1970
        return try await db.write { db in
            guard let row = try Self.row(pullID, in: db), row.approvalRequired, row.approvedAt == nil, row.removedAt == nil, row.expiresAt > now.microseconds else {
                return nil
            }
            try db.execute(sql: "UPDATE pull SET approved_by = ?, approved_at = ? WHERE id = ?", arguments: [approver, at, pullID])
            let detail = approvalDetail(pull: pullID, uid: row.uid, agent: row.agentId, requestedBy: row.requestedBy, reason: row.reason)
            try AuditRow.chained(at: at, actor: approver, action: AuditAction.pullApprove.rawValue, detail: detail, in: db).insert(db)
            return try Self.pull(pullID, now: now, in: db)
        }
    }

    public func pulls(limit: Int, reason: String?, now: Timestamp) async throws -> [Pull] {
        // One read: one snapshot, one trip to the database's queue.
        try await db.read { db in
            let ids: [String]
            if let reason {
                // SQLite's lower() folds ASCII only, as PullRows.reasonNeedle does.
                ids = try String.fetchAll(
                    db, sql: "SELECT id FROM pull WHERE instr(lower(reason), ?) > 0 ORDER BY created_at DESC, rowid DESC LIMIT ?",
                    arguments: [PullRows.reasonNeedle(reason), limit])
            } else {
                ids = try String.fetchAll(db, sql: "SELECT id FROM pull ORDER BY created_at DESC, rowid DESC LIMIT ?", arguments: [limit])
            }
            return try ids.compactMap { try Self.pull($0, now: now, in: db) }
        }
    }

    /// Marks a pull delivered just before its command is written; false when it is no longer
    /// queued or delivered (the agent's answer, or an expiry, moved it on meanwhile), and then
    /// it must not be sent.
    @discardableResult
    public func markDelivered(_ pullID: String, agent: String, at now: Date) async throws -> Bool {
        let deliver = PullTargetLife.deliver
        return try await db.write { db in
            try db.run(
                "UPDATE pull_target SET status = ?, updated_at = ? WHERE pull_id = ? AND agent_id = ? AND status IN \(PullTargetLife.sqlList(deliver.from))",
                [deliver.to.rawValue, now.timeIntervalSince1970, pullID, agent])
            return db.changesCount > 0
        }
    }

    /// The SQL list of final statuses: a target in one of them never changes again.
    static let finalStatuses = PullTargetLife.sqlList(PullTargetLife.final)

    /// Moves a target's status and progress, unless its status is already final (complete,
    /// rejected, failed, expired): whatever an agent sends afterwards changes nothing.
    ///
    /// - Parameter from: when given, the statuses the target may be in for this to apply (an
    ///   agent's repeated `CommandAccepted` moves a delivered pull on, not an uploading one back).
    @discardableResult
    public func update(
        _ pullID: String, agent: String, status: Status, detail: String, chunksReceived: Int?, chunkCount: Int?, bytes: Int64?, files: [String]?,
        errorCode: Int?, from: Set<Status>?, at now: Date
    ) async throws -> Bool {
        let allowed = from.map { " AND status IN (" + $0.map { "'\($0.rawValue)'" }.sorted().joined(separator: ",") + ")" } ?? ""
        return try await db.write { db in
            // A handful of texts (one per `from` set a caller passes): each kept prepared.
            try db.run(
                """
                UPDATE pull_target SET status = ?, detail = ?, updated_at = ?,
                    chunks_received = coalesce(?, chunks_received), chunk_count = coalesce(?, chunk_count),
                    bytes = coalesce(?, bytes), files = coalesce(?, files), error_code = coalesce(?, error_code)
                WHERE pull_id = ? AND agent_id = ? AND status NOT IN \(Self.finalStatuses)\(allowed)
                """,
                [
                    status.rawValue, detail, now.timeIntervalSince1970, chunksReceived, chunkCount, bytes,
                    files.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }, errorCode, pullID, agent,
                ])
            return db.changesCount > 0
        }
    }

    public func markRemoved(_ pullID: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { db -> RemovalMark? in
            guard let row = try Self.row(pullID, in: db) else { return nil }
            if let earlier = Removal(at: row.removedAt, by: row.removedBy, reason: row.removedReason) { return RemovalMark(removal: earlier, isNew: false) }
            let removal = Removal(at: now, by: actor, reason: reason)
            try db.execute(
                sql: "UPDATE pull SET removed_at = ?, removed_by = ?, removed_reason = ?, wrapped_key = x'' WHERE id = ?",
                arguments: [now.timeIntervalSince1970, actor, reason, pullID])
            let remove = PullTargetLife.remove
            try db.execute(
                sql: "UPDATE pull_target SET status = ?, detail = ?, updated_at = ?, error_code = ? WHERE pull_id = ? AND status IN \(PullTargetLife.sqlList(remove.from))",
                arguments: [
                    remove.to.rawValue, PullTargetLife.removedDetail(by: actor), now.timeIntervalSince1970, PullTargetLife.removedErrorCode.rawValue, pullID,
                ])
            return RemovalMark(removal: removal, isNew: true)
        }
    }

    public func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String] {
        let cutoffSeconds = cutoff.timeIntervalSince1970
        return try await db.read { db in
            try String.fetchAll(
                db,
                sql: """
                    SELECT id FROM pull p INDEXED BY pull_kept WHERE removed_at IS NULL AND expires_at <= ?
                    AND NOT EXISTS (
                        SELECT 1 FROM pull_target t WHERE t.pull_id = p.id AND (t.status NOT IN \(Self.finalStatuses) OR t.updated_at > ?))
                    ORDER BY expires_at, id LIMIT ?
                    """,
                arguments: [Timestamp(cutoff).microseconds, cutoffSeconds, max(limit, 0)])
        }
    }

    /// A pull's row, by a statement kept prepared.
    static func row(_ id: String, in db: Database) throws -> PullRow? {
        try prepared("SELECT * FROM pull WHERE id = ?", [id], as: PullRow.self).fetchOne(db)
    }

    /// What a command is made from. Throws ``UnreadablePull``, and makes nothing, when the pull
    /// is gone or its row does not read back exactly (an unreadable filter never becomes "all").
    public func storedPull(_ id: String) async throws -> StoredPull {
        try await db.read { try Self.storedPull(id, in: $0) }.get()
    }

    /// A pull's stored form, or why it cannot become a command; throws only for the database.
    static func storedPull(_ id: String, in db: Database) throws -> Result<StoredPull, UnreadablePull> {
        let row: PullRow?
        do {
            row = try Self.row(id, in: db)
        } catch let error as RowDecodingError {
            return .failure(UnreadablePull("the stored row of pull \(id) is unreadable: \(error)"))
        }
        guard let row else { return .failure(UnreadablePull("pull \(id) does not exist")) }
        let filter: LogFilter
        do {
            filter = try StoredFilter.decode(row.filter)
        } catch {
            return .failure(UnreadablePull("the stored filter of pull \(id) is unreadable: \(error)"))
        }
        return .success(
            StoredPull(
                id: id, uid: row.uid, filter: filter, issuedAt: Timestamp(microseconds: row.issuedAt), expiresAt: Timestamp(microseconds: row.expiresAt),
                wrappedKey: Array(row.wrappedKey), urgent: row.urgent))
    }
}
