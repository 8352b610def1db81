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
/// sends 660 a second). One whose uids are the ones this registry last wrote for the agent is
/// kept in memory and written with the others in one transaction, at most every
/// `heartbeatFlush` (by the heartbeat that finds the interval passed, or by ``agents()`` before
/// it reads); a change of uids is written at once, so ``agentIDs(withUID:)`` is never behind.
/// A crash loses the heartbeat times held, which presence resets anyway. Another process
/// reading the database (`dredge-server agents`) sees a held time once it is written: within
/// the interval while heartbeats keep arriving, else at the next heartbeat or agent list.
public final class AgentRegistry: AgentDirectory, Sendable {
    private let db: DatabasePool
    private let heartbeatFlush: Duration
    private let presence = Mutex(Presence())

    /// Heartbeat times and record counts held in memory, per agent.
    private typealias Held = [String: (at: Double, records: Int64)]

    /// Heartbeats held in memory, and the uids last written per agent.
    private struct Presence {
        var uids: [String: [String]] = [:]
        var pending: Held = [:]
        var lastFlush = ContinuousClock.now
    }

    public init(_ database: ServerDatabase, heartbeatFlush: Duration = .seconds(1)) {
        db = database.pool
        self.heartbeatFlush = heartbeatFlush
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

    /// Marks every agent disconnected: called when the server starts.
    public func resetPresence() async throws {
        try await db.write { try $0.execute(sql: "UPDATE agent SET connected = 0") }
    }

    /// Registers an agent's key (enrollment). A key that is already enrolled is refused
    /// (``AlreadyEnrolled``): whoever holds a token could otherwise rename another agent.
    public func enroll(publicKey: RSAPublicKey, host: WireHostInfo, now: Date = Date()) async throws -> String {
        let id = publicKey.agentID
        let row = AgentRow(
            id: id, publicKey: Data(publicKey.spki), hostname: host.hostname, os: host.os, app: host.app, appVersion: host.appVersion,
            enrolledAt: now.timeIntervalSince1970)
        let inserted = try await db.write { db in
            try row.insert(db, onConflict: .ignore)
            return db.changesCount > 0
        }
        guard inserted else { throw AlreadyEnrolled(agentID: id) }
        return id
    }

    public typealias AlreadyEnrolled = DredgeServer.AlreadyEnrolled

    public func publicKey(of agentID: String) async throws -> RSAPublicKey? {
        guard let row = try await db.read({ try AgentRow.fetchOne($0, key: agentID) }) else { return nil }
        return try RSAPublicKey(spki: row.publicKey)
    }

    /// Marks the agent connected through a new connection; returns that connection's
    /// generation, which ``disconnected(_:generation:)`` must present.
    @discardableResult
    public func connected(_ agentID: String, from address: String?, host: WireHostInfo, now: Date = Date()) async throws -> Int64 {
        try await db.write { db in
            try db.execute(
                sql: "UPDATE agent SET connected = 1, generation = generation + 1, connected_at = ?, remote_address = ?, hostname = ?, os = ?, app = ?, app_version = ? WHERE id = ?",
                arguments: [now.timeIntervalSince1970, address, host.hostname, host.os, host.app, host.appVersion, agentID])
            return try Int64.fetchOne(db, sql: "SELECT generation FROM agent WHERE id = ?", arguments: [agentID]) ?? 0
        }
    }

    /// Marks the agent offline if `generation` is still its newest connection's: a replaced
    /// connection that closes late leaves the live one's presence alone.
    public func disconnected(_ agentID: String, generation: Int64) async throws {
        try await db.write { try $0.execute(sql: "UPDATE agent SET connected = 0 WHERE id = ? AND generation = ?", arguments: [agentID, generation]) }
    }

    /// Records a heartbeat; the agent's uids are rewritten only when they changed. A heartbeat
    /// that breaks the rules (``HeartbeatRules/problem(with:)``) is refused and changes nothing.
    public func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date = Date()) async throws {
        if let problem = HeartbeatRules.problem(with: heartbeat) { throw DeploymentError(problem) }
        let sorted = Array(Set(heartbeat.activeUids)).sorted()
        let at = now.timeIntervalSince1970, records = Int64(clamping: heartbeat.stats.records)
        enum Step { case hold, flush(Held), write(with: Held) }
        let step: Step = presence.withLock { p in
            // New uids (or the first heartbeat this registry sees of the agent): written now,
            // with whatever is held.
            guard p.uids[agentID] == sorted else { return .write(with: Self.takePending(&p)) }
            if (p.pending[agentID]?.at ?? -.infinity) <= at { p.pending[agentID] = (at, records) }
            return ContinuousClock.now - p.lastFlush >= heartbeatFlush ? .flush(Self.takePending(&p)) : .hold
        }
        let held: Held
        switch step {
        case .hold: return
        case .flush(let due):
            try await write(due)
            return
        case .write(let pending): held = pending
        }
        let uids = String(decoding: try JSONEncoder().encode(sorted), as: UTF8.self)
        let known = try await db.write { db in
            try Self.write(held, into: db)
            let previous = try String.fetchOne(db, sql: "SELECT active_uids FROM agent WHERE id = ?", arguments: [agentID])
            guard previous != nil else { return false }
            try db.execute(
                sql: "UPDATE agent SET last_heartbeat_at = ?, active_uids = ?, store_records = ? WHERE id = ?",
                arguments: [at, uids, records, agentID])
            if previous != uids {
                try db.execute(sql: "DELETE FROM agent_uid WHERE agent_id = ?", arguments: [agentID])
                for uid in sorted { try AgentUIDRow(uid: uid, agentId: agentID).insert(db) }
            }
            return true
        }
        if known { presence.withLock { $0.uids[agentID] = sorted } }
    }

    private static func takePending(_ p: inout Presence) -> Held {
        p.lastFlush = .now
        defer { p.pending.removeAll(keepingCapacity: true) }
        return p.pending
    }

    private func write(_ held: Held) async throws {
        guard !held.isEmpty else { return }
        try await db.write { try Self.write(held, into: $0) }
    }

    /// Held heartbeats into the database; a time never goes back (two writes may land in
    /// either order).
    private static func write(_ held: Held, into db: Database) throws {
        guard !held.isEmpty else { return }
        let statement = try db.cachedStatement(
            sql: "UPDATE agent SET last_heartbeat_at = ?, store_records = ? WHERE id = ? AND coalesce(last_heartbeat_at, 0) <= ?")
        for (agent, beat) in held { try statement.execute(arguments: [beat.at, beat.records, agent, beat.at]) }
    }

    /// Writes the heartbeats held in memory now.
    public func flushHeartbeats() async throws {
        try await write(presence.withLock { Self.takePending(&$0) })
    }

    /// Agents whose last heartbeat reported `uid`. None for an invalid uid: SQLite's binding
    /// would cut `"u-1\u{0}x"` at its NUL and find `u-1`'s agents.
    public func agentIDs(withUID uid: String) async throws -> [String] {
        guard UserID.isValid(uid) else { return [] }
        return try await db.read { try String.fetchAll($0, sql: "SELECT agent_id FROM agent_uid WHERE uid = ? ORDER BY agent_id", arguments: [uid]) }
    }

    public func isEnrolled(_ agentID: String) async throws -> Bool {
        try await db.read { try AgentRow.exists($0, key: agentID) }
    }

    public func agents() async throws -> [AgentRecord] {
        try await flushHeartbeats()
        return try await db.read { db in
            // The uid index is the truth (the JSON column only detects a change).
            let uids = Dictionary(grouping: try AgentUIDRow.order(Column("agent_id"), Column("uid")).fetchAll(db), by: \.agentId).mapValues { $0.map(\.uid) }
            return try AgentRow.order(Column("hostname"), Column("id")).fetchAll(db).map { row in
                AgentRecord(
                    agentID: row.id, hostname: row.hostname, os: row.os, app: row.app, appVersion: row.appVersion,
                    enrolledAt: Date(timeIntervalSince1970: row.enrolledAt), connected: row.connected,
                    connectedAt: row.connectedAt.map(Date.init(timeIntervalSince1970:)), remoteAddress: row.remoteAddress,
                    lastHeartbeatAt: row.lastHeartbeatAt.map(Date.init(timeIntervalSince1970:)),
                    activeUIDs: uids[row.id] ?? [], storeRecords: UInt64(max(0, row.storeRecords)))
            }
        }
    }
}
