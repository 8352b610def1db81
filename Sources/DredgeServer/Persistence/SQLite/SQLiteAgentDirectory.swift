import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import GRDB
import Synchronization

/// The server's registry of agents in the server's database (``AgentDirectory``): who is
/// enrolled (with the public key that authenticates it) and who is connected, since when, from
/// where, serving which uids. Presence is reset at start.
///
/// Heartbeats are the registry's most frequent write (a fleet of 20,000 at the default interval
/// sends 660 a second). They are held as the PostgreSQL directory holds them
/// (``HeartbeatHold``): one whose uids are the ones this registry last wrote for the agent is
/// kept in memory, and its time written (with the others due, 64 rows a transaction) only once
/// the agent's row is `presenceRefresh` old (5 minutes by default), or when the agent
/// disconnects; a change of uids or a user report is written at once, so
/// ``agentIDs(withUID:)`` is never behind. An idle fleet of 18,000 then costs the database
/// about 60 row writes a second instead of 600, and the write-ahead log is checkpointed about
/// a seventh as often (measured): each checkpoint's fsyncs hold up every write queued behind
/// it, a pull's delivery among them (`docs/benchmarks.md`). ``agents()`` shows what is held over the rows
/// it reads, writing nothing. A crash loses the heartbeat times held, which presence resets
/// anyway; another process reading the database (`dredge-server agents`) sees a connected
/// agent's last heartbeat up to `presenceRefresh` (and one heartbeat interval) old.
public final class SQLiteAgentDirectory: AgentDirectory, Sendable {
    private let db: DatabasePool
    private let hold: HeartbeatHold

    private typealias Held = HeartbeatHold.Held

    public init(
        _ database: ServerDatabase, heartbeatFlush: Duration = .seconds(1), presenceRefresh: Duration = .seconds(300),
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        db = database.pool
        hold = HeartbeatHold(flushEvery: heartbeatFlush, refreshEvery: presenceRefresh, clock: clock)
    }

    /// The `agent` and `agent_uid` tables as they were when `server.sqlite` was merged into the
    /// one database (`prefix` empty: the names that file recorded).
    static func legacySchema(_ migrator: inout DatabaseMigrator, prefix: String) {
        migrator.registerMigration(prefix + "v1") { db in
            try db.execute(sql: """
                CREATE TABLE agent (
                    id TEXT PRIMARY KEY NOT NULL,
                    public_key BLOB NOT NULL,
                    hostname TEXT NOT NULL,
                    os TEXT NOT NULL,
                    app TEXT NOT NULL,
                    app_version TEXT NOT NULL,
                    enrolled_at REAL NOT NULL,
                    connected INTEGER NOT NULL DEFAULT 0,
                    connected_at REAL,
                    remote_address TEXT,
                    last_heartbeat_at REAL,
                    active_uids TEXT NOT NULL DEFAULT '[]',
                    store_records INTEGER NOT NULL DEFAULT 0
                );
                """)
        }
        // Pulls by uid look agents up by uid: an index instead of reading every agent.
        migrator.registerMigration(prefix + "v2-agent-uid") { db in
            try db.execute(sql: """
                CREATE TABLE agent_uid (
                    uid TEXT NOT NULL,
                    agent_id TEXT NOT NULL REFERENCES agent(id),
                    PRIMARY KEY (uid, agent_id)
                ) WITHOUT ROWID;
                INSERT OR IGNORE INTO agent_uid (uid, agent_id) SELECT j.value, a.id FROM agent a, json_each(a.active_uids) j;
                """)
        }
        // Presence by generation: each authenticated connection gets the next number, and
        // only the connection holding the current one may mark the agent offline.
        migrator.registerMigration(prefix + "v3-generation") { db in
            try db.execute(sql: "ALTER TABLE agent ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
        }
    }

    /// Migrations after the one database: the device's labels and the users its store holds
    /// (the heartbeat's user report), with the hour each was last seen.
    static func schema(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("agents-v4-users") { db in
            try db.execute(sql: """
                ALTER TABLE agent ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
                ALTER TABLE agent ADD COLUMN users_reported INTEGER NOT NULL DEFAULT 0;
                ALTER TABLE agent ADD COLUMN users_truncated INTEGER NOT NULL DEFAULT 0;
                ALTER TABLE agent ADD COLUMN users_digest TEXT NOT NULL DEFAULT '';
                CREATE TABLE agent_user (
                    uid TEXT NOT NULL,
                    agent_id TEXT NOT NULL REFERENCES agent(id),
                    last_seen_us INTEGER NOT NULL,
                    PRIMARY KEY (uid, agent_id)
                ) WITHOUT ROWID;
                CREATE INDEX agent_user_by_agent ON agent_user(agent_id);
                """)
        }
        // `agent_uid` is keyed by uid first: a heartbeat's write of the agent's own uids read
        // the whole table (twice) without this. With 18,720 agents a reconnection wave took
        // most of the server's CPU. (PostgreSQL's schema has had it from the start.)
        migrator.registerMigration("agents-v5-uid-by-agent") { db in
            try db.execute(sql: "CREATE INDEX agent_uid_by_agent ON agent_uid(agent_id)")
        }
        // A revoked agent (a lost device, a decommissioned host, #56): refused from then on,
        // what it uploaded kept.
        migrator.registerMigration("agents-v6-revocation") { db in
            try db.execute(sql: "ALTER TABLE agent ADD COLUMN revoked_at REAL; ALTER TABLE agent ADD COLUMN revoked_by TEXT")
        }
        // The generation of the server's keys each agent pins (key rotation, #56); agents
        // enrolled before rotations existed have the first.
        migrator.registerMigration("agents-v7-key-generation") { db in
            try db.execute(sql: "ALTER TABLE agent ADD COLUMN key_generation INTEGER NOT NULL DEFAULT 1")
        }
    }

    /// Marks every agent disconnected: called when the server starts.
    public func resetPresence() async throws {
        try await db.write { try $0.execute(sql: "UPDATE agent SET connected = 0") }
    }

    /// Registers an agent's key (enrollment). A key that is already enrolled is refused
    /// (``AlreadyEnrolled``): whoever holds a token could otherwise rename another agent.
    public func enroll(publicKey: RSAPublicKey, host: WireHostInfo, keyGeneration: Int, now: Date = Date()) async throws -> String {
        let id = publicKey.agentID
        let host = host.bounded
        let row = AgentRow(
            id: id, publicKey: Data(publicKey.spki), hostname: host.hostname, os: host.os, app: host.app, appVersion: host.appVersion,
            enrolledAt: now.timeIntervalSince1970, labels: try AgentRows.json(host.extra))
        let inserted = try await db.write { db in
            try row.insert(db, onConflict: .ignore)
            guard db.changesCount > 0 else { return false }
            try db.execute(sql: "UPDATE agent SET key_generation = ? WHERE id = ?", arguments: [keyGeneration, id])
            return true
        }
        guard inserted else { throw AlreadyEnrolled(agentID: id) }
        return id
    }

    public typealias AlreadyEnrolled = DredgeServer.AlreadyEnrolled

    public func publicKey(of agentID: String) async throws -> RSAPublicKey? {
        let spki = try await db.read { try prepared("SELECT public_key FROM agent WHERE id = ?", [agentID], as: Data.self).fetchOne($0) }
        return try spki.map { try RSAPublicKey(spki: $0) }
    }

    /// Marks the agent connected through a new connection; returns that connection's
    /// generation, which ``disconnected(_:generation:)`` must present.
    @discardableResult
    public func connected(_ agentID: String, from address: String?, host: WireHostInfo, now: Date = Date()) async throws -> Int64 {
        let host = host.bounded
        let labels = try AgentRows.json(host.extra)
        return try await db.write { db in
            try db.run(
                """
                UPDATE agent SET connected = 1, generation = generation + 1, connected_at = ?, remote_address = ?, hostname = ?, os = ?, app = ?,
                app_version = ?, labels = ? WHERE id = ?
                """,
                [now.timeIntervalSince1970, address, host.hostname, host.os, host.app, host.appVersion, labels, agentID])
            return try prepared("SELECT generation FROM agent WHERE id = ?", [agentID], as: Int64.self).fetchOne(db) ?? 0
        }
    }

    /// Marks the agent offline if `generation` is still its newest connection's: a replaced
    /// connection that closes late leaves the live one's presence alone. What is held of the
    /// agent's heartbeats is written with it: its row keeps when it was last heard.
    public func disconnected(_ agentID: String, generation: Int64) async throws {
        let held = hold.release(agentID)
        try await db.write { db in
            try Self.write(held, in: db)
            try db.run("UPDATE agent SET connected = 0 WHERE id = ? AND generation = ?", [agentID, generation])
        }
    }

    /// Holds a heartbeat with nothing new in it when no write is due (``HeartbeatHold``).
    public func holdHeartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool {
        hold.holdIfQuiet(agentID, heartbeat, now: now)
    }

    /// Records a heartbeat; the agent's active uids are rewritten only when they changed, its
    /// reported users whenever the heartbeat carries a report. A heartbeat that breaks the rules
    /// (``HeartbeatRules/problem(with:)``) is refused and changes nothing. Returns the uids the
    /// agent holds now and did not before.
    @discardableResult
    public func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date = Date()) async throws -> Set<String> {
        let full: HeartbeatHold.Full
        switch try hold.receive(agentID, heartbeat, now: now) {
        case .held(let due):
            try await write(due)
            return []
        case .full(let heartbeat): full = heartbeat
        }
        let (sorted, report, at, records, held) = (full.uids, full.report, full.at, full.records, full.held)
        let uids = try AgentRows.json(sorted)
        try await write(held)
        let outcome: (known: Bool, added: Set<String>) = try await db.write { db in
            let previous = try prepared("SELECT active_uids FROM agent WHERE id = ?", [agentID], as: String.self).fetchOne(db)
            guard previous != nil else { return (false, []) }
            let before = try Self.heldUIDs(of: agentID, in: db)
            try db.run("UPDATE agent SET last_heartbeat_at = ?, active_uids = ?, store_records = ? WHERE id = ?", [at, uids, records, agentID])
            if previous != uids {
                try db.run("DELETE FROM agent_uid WHERE agent_id = ?", [agentID])
                for uid in sorted { try AgentUIDRow(uid: uid, agentId: agentID).insert(db) }
            }
            // A report the same as the one stored (every reconnection sends one) is not rewritten.
            if let report, let digest = AgentRows.digest(report),
                try prepared("SELECT users_digest FROM agent WHERE id = ?", [agentID], as: String.self).fetchOne(db) != digest
            {
                try db.run("DELETE FROM agent_user WHERE agent_id = ?", [agentID])
                let insert = try db.cachedStatement(sql: "INSERT INTO agent_user (uid, agent_id, last_seen_us) VALUES (?, ?, ?)")
                for user in report.users { try insert.execute(arguments: [user.uid, agentID, user.lastSeenUs]) }
                try db.run(
                    "UPDATE agent SET users_reported = ?, users_truncated = ?, users_digest = ? WHERE id = ?", [report.users.count, report.truncated, digest, agentID])
            }
            return (true, try Self.heldUIDs(of: agentID, in: db).subtracting(before))
        }
        if outcome.known { hold.wrote(sorted, of: agentID) }
        return outcome.added
    }

    public func uids(of agentID: String) async throws -> Set<String> {
        try await db.read { try Self.heldUIDs(of: agentID, in: $0) }
    }

    /// The uids an agent holds: its active uids and its reported users.
    private static func heldUIDs(of agentID: String, in db: Database) throws -> Set<String> {
        Set(try prepared("SELECT uid FROM agent_uid WHERE agent_id = ? UNION SELECT uid FROM agent_user WHERE agent_id = ?", [agentID, agentID], as: String.self).fetchAll(db))
    }

    /// Held heartbeats into the database, at most ``heldPerTransaction`` rows a transaction,
    /// one transaction after the other: a pull or a chunk's progress written meanwhile waits
    /// for one batch, not for the whole flush. A time never goes back (two writes may land in
    /// either order).
    private func write(_ held: Held) async throws {
        guard !held.isEmpty else { return }
        // In key order: neighbouring rows share pages.
        let rows = held.sorted { $0.key < $1.key }
        for start in stride(from: 0, to: rows.count, by: Self.heldPerTransaction) {
            let batch = rows[start..<min(start + Self.heldPerTransaction, rows.count)]
            try await db.write { db in try Self.write(batch, in: db) }
        }
    }

    private static func write(_ held: some Collection<(key: String, value: (at: Double, records: Int64))>, in db: Database) throws {
        let statement = try db.cachedStatement(
            sql: "UPDATE agent SET last_heartbeat_at = ?, store_records = ? WHERE id = ? AND coalesce(last_heartbeat_at, 0) <= ?")
        for (agent, beat) in held { try statement.execute(arguments: [beat.at, beat.records, agent, beat.at]) }
    }

    /// Rows of held heartbeats written in one transaction.
    static let heldPerTransaction = 64

    /// Writes every heartbeat held in memory now, due or not.
    public func flushHeartbeats() async throws {
        try await write(hold.takePending())
    }

    public func revoke(_ agentID: String, by actor: String, at: Date) async throws -> Revocation {
        try await db.write { db in
            guard let row = try AgentRow.filter(key: agentID).fetchOne(db) else { return .unknown }
            if let revokedAt = row.revokedAt { return .alreadyRevoked(Date(timeIntervalSince1970: revokedAt)) }
            try db.execute(sql: "UPDATE agent SET revoked_at = ?, revoked_by = ? WHERE id = ?", arguments: [at.timeIntervalSince1970, actor, agentID])
            return .revoked
        }
    }

    public func revoked(among agentIDs: [String]) async throws -> [String] {
        guard !agentIDs.isEmpty else { return [] }
        let ids = agentIDs
        return try await db.read { db in
            try String.fetchAll(db, sql: "SELECT id FROM agent WHERE revoked_at IS NOT NULL AND id IN (SELECT value FROM json_each(?))", arguments: [String(decoding: try JSONEncoder().encode(ids), as: UTF8.self)])
        }
    }

    public func keyGeneration(of agentID: String) async throws -> Int? {
        try await db.read { try prepared("SELECT key_generation FROM agent WHERE id = ?", [agentID], as: Int.self).fetchOne($0) }
    }

    public func setKeyGeneration(_ agentID: String, _ generation: Int) async throws {
        try await db.write { try $0.execute(sql: "UPDATE agent SET key_generation = ? WHERE id = ?", arguments: [generation, agentID]) }
    }

    public func keyGenerations() async throws -> [Int: Int] {
        try await db.read { db in
            var counts: [Int: Int] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT key_generation, count(*) FROM agent WHERE revoked_at IS NULL GROUP BY key_generation") {
                counts[row[0]] = row[1]
            }
            return counts
        }
    }

    public func isRevoked(_ agentID: String) async throws -> Bool {
        try await db.read { try prepared("SELECT revoked_at IS NOT NULL FROM agent WHERE id = ?", [agentID], as: Bool.self).fetchOne($0) ?? false }
    }

    /// The agents that hold `uid` (active uids or user report). None for an invalid uid:
    /// SQLite's binding would cut `"u-1\u{0}x"` at its NUL and find `u-1`'s agents.
    public func holders(of uid: String) async throws -> [UIDHolder] {
        guard UserID.isValid(uid) else { return [] }
        return try await db.read { db in
            try prepared(
                """
                SELECT agent_id, max(last_seen_us) AS last_seen_us FROM (
                    SELECT agent_id, NULL AS last_seen_us FROM agent_uid WHERE uid = ?
                    UNION ALL
                    SELECT agent_id, last_seen_us FROM agent_user WHERE uid = ?
                ) WHERE agent_id NOT IN (SELECT id FROM agent WHERE revoked_at IS NOT NULL) GROUP BY agent_id ORDER BY agent_id
                """,
                [uid, uid], as: Row.self
            ).fetchAll(db).compactMap { row in
                guard let agent = row["agent_id"] as String? else { return nil }
                return UIDHolder(agentID: agent, lastSeen: (row["last_seen_us"] as Int64?).map { Date(timeIntervalSince1970: Double($0) / 1e6) })
            }
        }
    }

    public func isEnrolled(_ agentID: String) async throws -> Bool {
        try await db.read { try prepared("SELECT 1 FROM agent WHERE id = ?", [agentID], as: Int.self).fetchOne($0) != nil }
    }

    public func device(_ agentID: String) async throws -> RegisteredDevice? {
        try await db.read { db in
            try AgentRow.filter(key: agentID).fetchOne(db).map { row in
                RegisteredDevice(WireHostInfo.with {
                    $0.hostname = row.hostname
                    $0.os = row.os
                    $0.app = row.app
                    $0.appVersion = row.appVersion
                })
            }
        }
    }

    /// Every agent, with the heartbeats held shown over the rows (not written: a console
    /// listing every few seconds must not undo the bounded write rate).
    public func agents() async throws -> [AgentRecord] {
        let held = hold.peek()
        return try await db.read { db in
            // The uid index is the truth (the JSON column only detects a change).
            let uids = Dictionary(grouping: try AgentUIDRow.order(Column("agent_id"), Column("uid")).fetchAll(db), by: \.agentId).mapValues { $0.map(\.uid) }
            return try AgentRow.order(Column("hostname"), Column("id")).fetchAll(db).map { row in
                // Cleaned again as read: rows written before host info was bounded are shown safely too.
                let host = WireHostInfo.with {
                    $0.hostname = row.hostname
                    $0.os = row.os
                    $0.app = row.app
                    $0.appVersion = row.appVersion
                    $0.extra = AgentRows.labels(row.labels)
                }.bounded
                // A held heartbeat newer than the row's, as the write would make it.
                let newer = held[row.id].flatMap { $0.at >= (row.lastHeartbeatAt ?? -.infinity) ? $0 : nil }
                return AgentRecord(
                    agentID: row.id, hostname: host.hostname, os: host.os, app: host.app, appVersion: host.appVersion,
                    labels: host.extra, enrolledAt: Date(timeIntervalSince1970: row.enrolledAt), connected: row.connected,
                    connectedAt: row.connectedAt.map(Date.init(timeIntervalSince1970:)), remoteAddress: row.remoteAddress,
                    lastHeartbeatAt: (newer?.at ?? row.lastHeartbeatAt).map(Date.init(timeIntervalSince1970:)),
                    activeUIDs: uids[row.id] ?? [], reportedUsers: Int(row.usersReported), usersTruncated: row.usersTruncated,
                    storeRecords: UInt64(max(0, newer?.records ?? row.storeRecords)), revokedAt: row.revokedAt.map(Date.init(timeIntervalSince1970:)),
                    revokedBy: row.revokedBy)
            }
        }
    }

}
