import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Logging
import PostgresNIO

/// The pull queue and audit log in the PostgreSQL database (``PullQueue``, ``AuditLog``), the
/// same rules as the embedded ``SQLitePullQueue`` (from ``PullTargetLife``), shared by every node: a status move is one guarded
/// `UPDATE`, so two nodes racing on one target cannot both move it.
public final class PostgresPullQueue: PullQueue, AuditLog, Sendable {
    private let db: PostgresDatabase

    public init(_ database: PostgresDatabase) { db = database }

    /// The channel pulls are announced on: one per schema (the deployment's tables).
    var channel: String { Self.channel(of: db) }

    static func channel(of db: PostgresDatabase) -> String {
        db.location.schema == "public" ? "dredge_pull" : "dredge_pull_" + db.location.schema.prefix(40)
    }

    /// Announces, when the transaction commits, that these agents have a pull queued: at most
    /// 200 ids a notification (a payload holds under 8,000 bytes).
    private func announce(_ agents: [String], on c: PostgresConnection) async throws {
        var rest = agents[...]
        while !rest.isEmpty {
            let part = rest.prefix(200).joined(separator: ",")
            rest = rest.dropFirst(200)
            try await c.run("SELECT pg_notify(\(channel), \(part))")
        }
    }

    private static let final = PullTargetLife.final.map(\.rawValue).sorted()

    /// A move's `from` statuses, for `status = ANY(…)`.
    private static func from(_ move: PullTargetLife.Move) -> [String] { move.from.map(\.rawValue).sorted() }

    public func create(_ pull: NewPull) async throws {
        if let problem = pull.filter.problem { throw DeploymentError(problem) }
        let filterJSON = try StoredFilter.encode(pull.filter)
        let now = Date().timeIntervalSince1970
        let detail = pull.auditDetail
        try await db.write { c in
            try await Self.auditTransaction(c)
            try await c.run(
                """
                INSERT INTO pull (id, uid, agent_id, filter, issued_at, expires_at, wrapped_key, requested_by, reason, created_at, scope, approval_required, urgent)
                VALUES (\(pull.id), \(pull.uid), \(pull.agentID), \(filterJSON.storable), \(pull.issuedAt.microseconds), \(pull.expiresAt.microseconds),
                    \(ByteBuffer(bytes: pull.wrappedKey)), \(pull.requestedBy), \(pull.reason.storable), \(now), \(pull.scope?.storable), \(pull.approvalRequired), \(pull.urgent))
                """)
            try await c.run(
                """
                INSERT INTO pull_target (pull_id, agent_id, status, updated_at)
                SELECT \(pull.id), a, \(PullStatus.queued.rawValue), \(now) FROM unnest(\(pull.targets)::text[]) AS a
                """)
            try await Self.insertAudit(at: now, actor: pull.requestedBy, action: AuditAction.pull.rawValue, detail: detail, on: c)
            try await announce(pull.targets, on: c)
        }
    }

    public func pull(_ id: String, now: Timestamp) async throws -> PullRecord? {
        try await db.read { try await Self.pull(id, now: now, on: $0) }
    }

    private static func pull(_ id: String, now: Timestamp, on c: PostgresConnection) async throws -> PullRecord? {
        guard
            let row = try await c.rows(
                """
                SELECT id, uid, agent_id, filter, issued_at, expires_at, requested_by, removed_at, removed_by, removed_reason, reason,
                    approval_required, approved_by, approved_at, scope, urgent FROM pull WHERE id = \(id)
                """
            ).first
        else { return nil }
        let (pullID, uid, agentID, filter, issuedAt, expiresAt, requestedBy, removedAt, removedBy, removedReason, reason, approvalRequired, approvedBy, approvedAt, scope, urgent) =
            try row.decode((String, String, String, String, Int64, Int64, String, Double?, String?, String?, String, Bool, String?, Double?, String?, Bool).self)
        let targets = try await c.rows(
            """
            SELECT agent_id, status, detail, chunks_received, chunk_count, bytes, files, updated_at, error_code FROM pull_target
            WHERE pull_id = \(id) ORDER BY agent_id
            """
        ).map { row in
            let (agent, status, detail, chunksReceived, chunkCount, bytes, files, updatedAt, errorCode) =
                try row.decode((String, String, String, Int64, Int64, Int64, String, Double, Int64?).self)
            // A queued pull past its expiry is expired even if no delivery pass marked it yet.
            let (shown, shownDetail) = PullTargetLife.shown(
                try PullRows.status(status, of: id), detail: detail, expiresAt: Timestamp(microseconds: expiresAt), now: now)
            return PullTarget(
                pullID: pullID, agentID: agent, status: shown, detail: shownDetail,
                chunksReceived: Int(chunksReceived), chunkCount: Int(chunkCount), bytes: bytes, files: try PullRows.files(files, of: id),
                updatedAt: Date(timeIntervalSince1970: updatedAt), errorCode: errorCode.map { Int($0) })
        }
        return PullRecord(
            id: pullID, uid: uid, agentID: agentID, filter: PullRows.shownFilter(filter),
            issuedAt: Timestamp(microseconds: issuedAt), expiresAt: Timestamp(microseconds: expiresAt),
            requestedBy: requestedBy, reason: reason.isEmpty ? nil : reason, targets: targets,
            removed: Removal(at: removedAt, by: removedBy, reason: removedReason),
            approval: approvalRequired ? PullApproval(approvedBy: approvedBy, approvedAt: approvedAt.map(Date.init(timeIntervalSince1970:))) : nil,
            scope: try AccessScope.stored(scope, of: "pull \(id)"), urgent: urgent)
    }

    public func approve(_ pullID: String, by approver: String, now: Timestamp) async throws -> PullRecord? {
        let at = now.date.timeIntervalSince1970
        return try await db.write { c in
            try await Self.auditTransaction(c)
            // The row locked: two approvals at once, on any nodes, approve once.
            guard
                let row = try await c.rows(
                    """
                    SELECT uid, agent_id, requested_by, reason FROM pull WHERE id = \(pullID) AND approval_required AND approved_at IS NULL AND removed_at IS NULL
                    AND expires_at > \(now.microseconds) FOR UPDATE
                    """
                ).first
            else { return nil }
            let (uid, agent, requestedBy, reason) = try row.decode((String, String, String, String).self)
            try await c.run("UPDATE pull SET approved_by = \(approver), approved_at = \(at) WHERE id = \(pullID)")
            let detail = approvalDetail(pull: pullID, uid: uid, agent: agent, requestedBy: requestedBy, reason: reason)
            try await Self.insertAudit(at: at, actor: approver, action: AuditAction.pullApprove.rawValue, detail: detail, on: c)
            let targets = try await c.rows("SELECT agent_id FROM pull_target WHERE pull_id = \(pullID)").map { try $0.decode(String.self) }
            try await announce(targets, on: c)
            return try await Self.pull(pullID, now: now, on: c)
        }
    }

    public func pulls(limit: Int, reason: String?, now: Timestamp) async throws -> [PullRecord] {
        try await db.write { c in
            // One snapshot for the list (the transaction's), as the embedded store reads it.
            try await c.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            var pulls: [PullRecord] = []
            let rows =
                if let reason {
                    // ASCII letters lowered only, as the embedded store's lower() does.
                    try await c.rows(
                        """
                        SELECT id FROM pull WHERE strpos(translate(reason, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'), \(PullRows.reasonNeedle(reason))) > 0
                        ORDER BY created_at DESC, seq DESC LIMIT \(Int64(max(limit, 0)))
                        """)
                } else {
                    try await c.rows("SELECT id FROM pull ORDER BY created_at DESC, seq DESC LIMIT \(Int64(max(limit, 0)))")
                }
            for row in rows {
                if let pull = try await Self.pull(try row.decode(String.self), now: now, on: c) { pulls.append(pull) }
            }
            return pulls
        }
    }

    public func storedPull(_ id: String) async throws -> StoredPull {
        let row = try await db.read { c in try await c.rows("SELECT \(unescaped: Self.storedColumns) FROM pull WHERE id = \(id)").first }
        guard let row else { throw UnreadablePull("pull \(id) does not exist") }
        return try Self.storedPull(id, columns: row.makeRandomAccess(), from: 0).get()
    }

    /// What ``storedPull(_:columns:from:)`` reads, in order.
    static let storedColumns = "uid, filter, issued_at, expires_at, wrapped_key, urgent"

    /// A pull's stored form from ``storedColumns`` (starting at column `first`), or why it
    /// cannot become a command.
    static func storedPull(_ id: String, columns row: PostgresRandomAccessRow, from first: Int) -> Result<StoredPull, UnreadablePull> {
        let uid: String, stored: String, issuedAt: Int64, expiresAt: Int64, key: ByteBuffer, urgent: Bool
        do {
            uid = try row[first].decode(String.self)
            stored = try row[first + 1].decode(String.self)
            issuedAt = try row[first + 2].decode(Int64.self)
            expiresAt = try row[first + 3].decode(Int64.self)
            key = try row[first + 4].decode(ByteBuffer.self)
            urgent = try row[first + 5].decode(Bool.self)
        } catch {
            return .failure(UnreadablePull("the stored row of pull \(id) is unreadable: \(String(reflecting: error))"))
        }
        let filter: LogFilter
        do {
            filter = try StoredFilter.decode(stored)
        } catch {
            return .failure(UnreadablePull("the stored filter of pull \(id) is unreadable: \(error)"))
        }
        return .success(
            StoredPull(
                id: id, uid: uid, filter: filter, issuedAt: Timestamp(microseconds: issuedAt), expiresAt: Timestamp(microseconds: expiresAt),
                wrappedKey: Array(key.readableBytesView), urgent: urgent))
    }

    public func wrappedKey(of pullID: String) async throws -> [UInt8]? {
        try await db.read { try await $0.value("SELECT wrapped_key FROM pull WHERE id = \(pullID)", as: ByteBuffer.self) }.map { Array($0.readableBytesView) }
    }

    public func deliverable(for agentID: String, includingUnanswered: Bool, now: Timestamp) async throws -> [DuePull] {
        let statuses = PullTargetLife.deliverable(includingUnanswered: includingUnanswered).map(\.rawValue).sorted()
        let open = try await db.read { c in
            try await c.rows(
                """
                SELECT t.pull_id, t.status, p.expires_at, \(unescaped: Self.storedColumns.split(separator: ", ").map { "p." + $0 }.joined(separator: ", "))
                FROM pull_target t JOIN pull p ON p.id = t.pull_id
                WHERE t.agent_id = \(agentID) AND t.status = ANY(\(statuses)::text[]) AND (NOT p.approval_required OR p.approved_at IS NOT NULL)
                ORDER BY p.created_at, t.pull_id
                """
            ).map { row in
                let columns = row.makeRandomAccess()
                let id = try columns[0].decode(String.self)
                return (id, try columns[1].decode(String.self), try columns[2].decode(Int64.self), Self.storedPull(id, columns: columns, from: 3))
            }
        }
        let expired = try open.filter {
            PullTargetLife.expiredBeforeDelivery(try PullRows.status($0.1, of: $0.0), expiresAt: Timestamp(microseconds: $0.2), now: now)
        }.map(\.0)
        if !expired.isEmpty {
            let move = PullTargetLife.expireBeforeDelivery
            try await db.write { c in
                try await c.run(
                    """
                    UPDATE pull_target SET status = \(move.to.rawValue), detail = \(PullTargetLife.expiredBeforeDeliveryDetail),
                        updated_at = \(Date().timeIntervalSince1970)
                    WHERE pull_id = ANY(\(expired)::text[]) AND agent_id = \(agentID) AND status = ANY(\(Self.from(move))::text[])
                    """)
            }
        }
        return open.filter { PullTargetLife.isSent(expiresAt: Timestamp(microseconds: $0.2), now: now) }.map { DuePull(id: $0.0, stored: $0.3) }
    }

    public func markDelivered(_ pullID: String, agent: String, at now: Date) async throws -> Bool {
        let deliver = PullTargetLife.deliver
        return try await db.write { c in
            try await c.run(
                """
                UPDATE pull_target SET status = \(deliver.to.rawValue), updated_at = \(now.timeIntervalSince1970)
                WHERE pull_id = \(pullID) AND agent_id = \(agent) AND status = ANY(\(Self.from(deliver))::text[]) RETURNING 1
                """) > 0
        }
    }

    public func update(
        _ pullID: String, agent: String, status: PullStatus, detail: String, chunksReceived: Int?, chunkCount: Int?, bytes: Int64?, files: [String]?,
        errorCode: Int?, from: Set<PullStatus>?, at now: Date
    ) async throws -> Bool {
        let allowed = from.map { $0.map(\.rawValue).sorted() } ?? PullStatus.allCases.map(\.rawValue)
        let filesJSON = try files.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self).storable }
        return try await db.write { c in
            try await c.run(
                """
                UPDATE pull_target SET status = \(status.rawValue), detail = \(detail.storable), updated_at = \(now.timeIntervalSince1970),
                    chunks_received = coalesce(\(chunksReceived.map(Int64.init)), chunks_received), chunk_count = coalesce(\(chunkCount.map(Int64.init)), chunk_count),
                    bytes = coalesce(\(bytes), bytes), files = coalesce(\(filesJSON), files), error_code = coalesce(\(errorCode.map(Int64.init)), error_code)
                WHERE pull_id = \(pullID) AND agent_id = \(agent) AND NOT (status = ANY(\(Self.final)::text[])) AND status = ANY(\(allowed)::text[])
                RETURNING 1
                """) > 0
        }
    }

    public func expireStalled(now: Date, listeningSince: Date, deadlines: PullTargetLife.Deadlines) async throws -> Int {
        let stall = PullTargetLife.stall
        let open = try await db.read { c in
            try await c.rows(
                """
                SELECT t.pull_id, t.agent_id, t.status, t.updated_at, p.expires_at FROM pull_target t JOIN pull p ON p.id = t.pull_id
                WHERE t.status = ANY(\(Self.from(stall))::text[]) AND p.expires_at <= \(Timestamp(now).microseconds)
                """
            ).map { try $0.decode((String, String, String, Double, Int64).self) }
        }
        var ended = 0
        for (pullID, agent, stored, updatedAt, expiresAt) in open {
            let status = try PullRows.status(stored, of: pullID)
            guard
                let detail = deadlines.ending(
                    status, heard: Timestamp(Date(timeIntervalSince1970: updatedAt)), expiresAt: Timestamp(microseconds: expiresAt), now: Timestamp(now),
                    listeningSince: PullRows.listening(since: listeningSince))
            else { continue }
            ended += try await db.write { c in
                // Guarded by the status it was read in: a target that moved meanwhile is left alone.
                try await c.run(
                    """
                    UPDATE pull_target SET status = \(stall.to.rawValue), detail = \(detail), updated_at = \(now.timeIntervalSince1970)
                    WHERE pull_id = \(pullID) AND agent_id = \(agent) AND status = \(status.rawValue) RETURNING 1
                    """)
            }
        }
        return ended
    }

    public func agentsWithQueuedPulls() async throws -> Set<String> {
        try await db.read { c in
            Set(try await c.rows("SELECT DISTINCT agent_id FROM pull_target WHERE status = \(PullStatus.queued.rawValue)").map { try $0.decode(String.self) })
        }
    }

    public func adopt(agent: String, uids: Set<String>, now: Timestamp) async throws -> [String] {
        guard !uids.isEmpty else { return [] }
        let wanted = Set(uids.filter(UserID.isValid).map { Array($0.utf8) })
        let open = try await db.read { c in
            try await c.rows(
                """
                SELECT id, uid FROM pull WHERE agent_id = '' AND expires_at > \(now.microseconds) AND uid <> '' AND removed_at IS NULL AND scope IS NULL
                AND NOT EXISTS (SELECT 1 FROM pull_target t WHERE t.pull_id = pull.id AND t.agent_id = \(agent))
                ORDER BY created_at, seq
                """
            ).map { try $0.decode((String, String).self) }
        }
        let matching = open.filter { wanted.contains(Array($0.1.utf8)) }.map(\.0)
        guard !matching.isEmpty else { return [] }
        let at = now.date.timeIntervalSince1970
        return try await db.write { c in
            var adopted: [String] = []
            for pull in matching {
                // Not a pull removed since the read: its row share-locked, so a removal on
                // another node (which locks it for update) waits for this, or this for it.
                guard try await c.run("SELECT 1 FROM pull WHERE id = \(pull) AND removed_at IS NULL FOR SHARE") > 0 else { continue }
                let added = try await c.run(
                    """
                    INSERT INTO pull_target (pull_id, agent_id, status, updated_at)
                    SELECT id, \(agent), \(PullStatus.queued.rawValue), \(at) FROM pull WHERE id = \(pull) AND removed_at IS NULL
                    ON CONFLICT (pull_id, agent_id) DO NOTHING RETURNING 1
                    """)
                if added > 0 { adopted.append(pull) }
            }
            if !adopted.isEmpty { try await announce([agent], on: c) }
            return adopted
        }
    }

    public func markRemoved(_ pullID: String, by actor: String, reason: String, at now: Date) async throws -> RemovalMark? {
        try await db.write { c -> RemovalMark? in
            guard let row = try await c.rows("SELECT removed_at, removed_by, removed_reason FROM pull WHERE id = \(pullID) FOR UPDATE").first else { return nil }
            let (at, by, earlierReason) = try row.decode((Double?, String?, String?).self)
            if let earlier = Removal(at: at, by: by, reason: earlierReason) { return RemovalMark(removal: earlier, isNew: false) }
            try await c.run(
                """
                UPDATE pull SET removed_at = \(now.timeIntervalSince1970), removed_by = \(actor), removed_reason = \(reason.storable), wrapped_key = ''::bytea
                WHERE id = \(pullID)
                """)
            let remove = PullTargetLife.remove
            try await c.run(
                """
                UPDATE pull_target SET status = \(remove.to.rawValue), detail = \(PullTargetLife.removedDetail(by: actor)), updated_at = \(now.timeIntervalSince1970),
                    error_code = \(Int64(PullTargetLife.removedErrorCode.rawValue))
                WHERE pull_id = \(pullID) AND status = ANY(\(Self.from(remove))::text[])
                """)
            return RemovalMark(removal: Removal(at: now, by: actor, reason: reason.storable), isNew: true)
        }
    }

    public func removable(keptUntil cutoff: Date, limit: Int) async throws -> [String] {
        try await db.read { c in
            try await c.rows(
                """
                SELECT id FROM pull p WHERE removed_at IS NULL AND expires_at <= \(Timestamp(cutoff).microseconds)
                AND NOT EXISTS (
                    SELECT 1 FROM pull_target t WHERE t.pull_id = p.id AND (NOT (t.status = ANY(\(Self.final)::text[])) OR t.updated_at > \(cutoff.timeIntervalSince1970)))
                ORDER BY expires_at, id LIMIT \(Int64(max(limit, 0)))
                """
            ).map { try $0.decode(String.self) }
        }
    }

    // MARK: Audit

    public func record(actor: String, action: String, detail: String, at: Date) async throws {
        try await db.write { c in
            try await Self.auditTransaction(c)
            try await Self.insertAudit(at: at.timeIntervalSince1970, actor: actor, action: action, detail: detail, on: c)
        }
    }

    /// The audit log's turn, across nodes: entries chain in the order of their ids.
    static let auditLock: Int64 = 7_466_218_402

    /// The first statement of a transaction that inserts an audit entry: READ COMMITTED
    /// whatever the database's default, so the last entry is read after ``auditLock`` is
    /// held (a snapshot taken before it could miss an entry another node just committed, and
    /// the chain would fork).
    static func auditTransaction(_ c: PostgresConnection) async throws {
        try await c.run("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    }

    /// Inserts an entry chained after the log's last one (``AuditChain``), in `c`'s transaction,
    /// holding ``auditLock`` until it ends. The hash is over the text as stored.
    static func insertAudit(at: Double, actor: String, action: String, detail: String, on c: PostgresConnection) async throws {
        try await c.run("SELECT pg_advisory_xact_lock(\(auditLock))")
        let previous = try await c.value("SELECT hash FROM audit ORDER BY id DESC LIMIT 1", as: ByteBuffer?.self).flatMap { $0 }.map { Array($0.readableBytesView) }
        let (actor, action, detail) = (actor.storable, action.storable, detail.storable)
        let hash = AuditChain.link(after: previous ?? AuditChain.genesis, at: at, actor: actor, action: action, detail: detail)
        try await c.run("INSERT INTO audit (at, actor, action, detail, hash) VALUES (\(at), \(actor), \(action), \(detail), \(ByteBuffer(bytes: hash)))")
    }

    /// Hashes the entries written before the chain (the schema step that adds it).
    static func chainExisting(on c: PostgresConnection) async throws {
        var previous = AuditChain.genesis
        for row in try await c.rows("SELECT id, at, actor, action, detail FROM audit ORDER BY id") {
            let (id, at, actor, action, detail) = try row.decode((Int64, Double, String, String, String).self)
            let hash = AuditChain.link(after: previous, at: at, actor: actor, action: action, detail: detail)
            try await c.run("UPDATE audit SET hash = \(ByteBuffer(bytes: hash)) WHERE id = \(id)")
            previous = hash
        }
    }

    public func chainEntries(after: Int64, limit: Int) async throws -> [AuditChain.Stored] {
        try await db.read { c in
            try await c.rows("SELECT id, at, actor, action, detail, hash FROM audit WHERE id > \(after) ORDER BY id LIMIT \(Int64(max(limit, 0)))").map { row in
                let (id, at, actor, action, detail, hash) = try row.decode((Int64, Double, String, String, String, ByteBuffer?).self)
                return AuditChain.Stored(id: id, at: at, actor: actor, action: action, detail: detail, hash: hash.map { Array($0.readableBytesView) })
            }
        }
    }

    public func audit(_ query: AuditQuery) async throws -> [AuditEntry] {
        var sql = "SELECT id, at, actor, action, detail FROM audit WHERE true"
        var binds = PostgresBindings()
        func bind(_ value: some PostgresDynamicTypeEncodable) -> String {
            binds.append(value)
            return "$\(binds.count)"
        }
        if let since = query.since { sql += " AND at >= \(bind(since.timeIntervalSince1970))" }
        if let actor = query.actor { sql += " AND actor = \(bind(actor.storable))" }
        // An action of the log is itself only; any other name is a group (see SQLitePullQueue).
        if let action = query.action?.storable {
            sql += AuditQuery.isExact(action)
                ? " AND action = \(bind(action))" : " AND (action = \(bind(action)) OR (action > \(bind(action + ".")) AND action < \(bind(action + "/"))))"
        }
        if let before = query.before { sql += " AND id < \(bind(before))" }
        sql += " ORDER BY id DESC LIMIT \(min(max(query.limit, 1), 10_000))"
        let statement = PostgresQuery(unsafeSQL: sql, binds: binds)
        return try await db.read { c in
            try await c.rows(statement).map { row in
                let (id, at, actor, action, detail) = try row.decode((Int64, Double, String, String, String).self)
                return AuditEntry(id: id, at: Date(timeIntervalSince1970: at), actor: actor, action: action, detail: detail)
            }
        }
    }
}

extension PostgresPullQueue: PullNotices {
    public func listen(logger: Logger, _ wake: @escaping @Sendable ([String]) -> Void) async {
        var backoff = Duration.milliseconds(250)
        while !Task.isCancelled {
            do {
                try await db.client.withConnection { connection in
                    try await connection.listen(on: channel) { notifications in
                        // Listening now: whatever was queued while it was not is delivered too.
                        // (And the triggers may have changed: every connected agent's set is looked at again.)
                        wake(Array(try await agentsWithQueuedPulls()) + [PullDispatcher.triggersChangedMark])
                        backoff = .milliseconds(250)
                        for try await notification in notifications {
                            wake(notification.payload.split(separator: ",").map(String.init))
                        }
                    }
                }
            } catch {
                if Task.isCancelled { return }
                logger.warning("pull notifications: listening failed; listening again", metadata: ["error": "\(DatabaseFailure.wrapping(error))"])
            }
            try? await Task.sleep(for: backoff)
            backoff = min(backoff * 2, .seconds(10))
        }
    }
}
