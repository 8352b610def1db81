import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import PostgresNIO
import Synchronization

/// The enrolled agents and their presence in the PostgreSQL database (``AgentDirectory``),
/// shared by the nodes of a cluster.
///
/// Presence is leased: ``connected(_:from:host:now:)`` records the node that holds the
/// connection (``NodeLease``), and an agent reads as connected only while that node's lease
/// lasts. ``resetPresence()`` (a node starts) takes this node's lease and clears only its own
/// agents: never another node's.
///
/// Heartbeats are held as the embedded registry holds them (``SQLiteAgentDirectory``, through
/// ``HeartbeatHold``): one whose uids did not change is kept in memory; a change of uids or a
/// user report is written at once, so ``holders(of:)`` is never behind. A held heartbeat's
/// time is written (batched with the others, one statement) only once the agent's row is
/// `presenceRefresh` old (20 minutes by default), or when the agent disconnects: 10,000 idle
/// agents cost the database about 8 row writes a second however short their heartbeat
/// interval (`docs/benchmarks.md`, `cluster.presence_writes`). This node's listing shows what
/// it holds over the rows, writing nothing; another process reads the rows.
public final class PostgresAgentDirectory: AgentDirectory, Sendable {
    private let db: PostgresDatabase
    private let hold: HeartbeatHold
    /// The node this directory records connections under.
    public let node: NodeLease

    private typealias Held = HeartbeatHold.Held

    /// `node`: this process's lease (a new one, not yet taken, when nil: the lease is taken
    /// by the first connection or ``resetPresence()``).
    public init(
        _ database: PostgresDatabase, node: NodeLease? = nil, heartbeatFlush: Duration = .seconds(1), presenceRefresh: Duration = .seconds(1200),
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        db = database
        self.node = node ?? NodeLease(database)
        hold = HeartbeatHold(flushEvery: heartbeatFlush, refreshEvery: presenceRefresh, clock: clock)
    }

    /// This node starts: its lease is taken, and its own agents (and rows of no node) are
    /// marked offline. Other nodes' agents are left alone, even those of a node whose lease has
    /// lapsed: they read as offline through the lease, and as online again if that node was
    /// only cut off for a while and renews it.
    public func resetPresence() async throws {
        try await node.join()
        try await db.write {
            try await $0.run(
                """
                UPDATE agent SET connected = false WHERE connected AND (node_id IS NULL OR node_id = \(self.node.id))
                """)
        }
    }

    public func enroll(publicKey: RSAPublicKey, host: WireHostInfo, keyGeneration: Int, now: Date) async throws -> String {
        let id = publicKey.agentID
        let host = host.bounded
        let labels = try AgentRows.json(host.extra)
        let key = ByteBuffer(bytes: publicKey.spki)
        let inserted = try await db.write { c in
            try await c.run(
                """
                INSERT INTO agent (id, public_key, hostname, os, app, app_version, enrolled_at, labels, key_generation)
                VALUES (\(id), \(key), \(host.hostname.storable), \(host.os.storable), \(host.app.storable), \(host.appVersion.storable),
                    \(now.timeIntervalSince1970), \(labels.storable), \(keyGeneration))
                ON CONFLICT (id) DO NOTHING RETURNING 1
                """)
        }
        guard inserted > 0 else { throw AlreadyEnrolled(agentID: id) }
        return id
    }

    public func publicKey(of agentID: String) async throws -> RSAPublicKey? {
        guard let key = try await db.read({ try await $0.value("SELECT public_key FROM agent WHERE id = \(agentID)", as: ByteBuffer.self) }) else { return nil }
        return try RSAPublicKey(spki: Data(key.readableBytesView))
    }

    public func connected(_ agentID: String, from address: String?, host: WireHostInfo, now: Date) async throws -> Int64 {
        let host = host.bounded
        let labels = try AgentRows.json(host.extra)
        // The uids this node last wrote may be stale: the agent may have been on another node
        // since. Its first heartbeat here is written in full.
        hold.forget(agentID)
        try await node.joinedOnce()
        let nodeID = node.id
        return try await db.write { c in
            try await c.value(
                """
                UPDATE agent SET connected = true, generation = generation + 1, connected_at = \(now.timeIntervalSince1970), remote_address = \(address?.storable),
                    node_id = \(nodeID), hostname = \(host.hostname.storable), os = \(host.os.storable), app = \(host.app.storable), app_version = \(host.appVersion.storable),
                    labels = \(labels.storable)
                WHERE id = \(agentID) RETURNING generation
                """, as: Int64.self) ?? 0
        }
    }

    /// What is held of the agent's heartbeats is written with it: its row keeps when it was last heard.
    public func disconnected(_ agentID: String, generation: Int64) async throws {
        let held = hold.release(agentID)
        try await db.write { c in
            try await Self.write(held, on: c)
            try await c.run("UPDATE agent SET connected = false WHERE id = \(agentID) AND generation = \(generation)")
        }
    }

    /// Holds a heartbeat with nothing new in it when no write is due (``HeartbeatHold``).
    public func holdHeartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) -> Bool {
        hold.holdIfQuiet(agentID, heartbeat, now: now)
    }

    public func heartbeat(_ agentID: String, _ heartbeat: WireHeartbeat, now: Date) async throws -> Set<String> {
        let full: HeartbeatHold.Full
        switch try hold.receive(agentID, heartbeat, now: now) {
        case .held(let due):
            try await write(due)
            return []
        case .full(let heartbeat): full = heartbeat
        }
        let (sorted, report, at, records, held) = (full.uids, full.report, full.at, full.records, full.held)
        let uids = try AgentRows.json(sorted)
        let digest = report.flatMap(AgentRows.digest)
        let outcome: (known: Bool, added: Set<String>) = try await db.write { c in
            try await Self.write(held, on: c)
            // The agent's row locked: two connections of one agent write one after the other.
            guard let previous = try await c.value("SELECT active_uids FROM agent WHERE id = \(agentID) FOR UPDATE", as: String.self) else {
                return (false, [])
            }
            let before = try await Self.heldUIDs(of: agentID, on: c)
            try await c.run(
                "UPDATE agent SET last_heartbeat_at = \(at), active_uids = \(uids), store_records = \(records) WHERE id = \(agentID)")
            if previous != uids {
                try await c.run("DELETE FROM agent_uid WHERE agent_id = \(agentID)")
                try await c.run("INSERT INTO agent_uid (uid, agent_id) SELECT u, \(agentID) FROM unnest(\(sorted)::text[]) AS u")
            }
            if let report, let digest, try await c.value("SELECT users_digest FROM agent WHERE id = \(agentID)", as: String.self) != digest {
                try await c.run("DELETE FROM agent_user WHERE agent_id = \(agentID)")
                let users = report.users.map(\.uid), seen = report.users.map(\.lastSeenUs)
                try await c.run(
                    "INSERT INTO agent_user (uid, agent_id, last_seen_us) SELECT u, \(agentID), s FROM unnest(\(users)::text[], \(seen)::bigint[]) AS x(u, s)")
                try await c.run(
                    """
                    UPDATE agent SET users_reported = \(Int64(report.users.count)), users_truncated = \(report.truncated), users_digest = \(digest)
                    WHERE id = \(agentID)
                    """)
            }
            return (true, try await Self.heldUIDs(of: agentID, on: c).subtracting(before))
        }
        if outcome.known { hold.wrote(sorted, of: agentID) }
        return outcome.added
    }

    public func uids(of agentID: String) async throws -> Set<String> {
        try await db.read { try await Self.heldUIDs(of: agentID, on: $0) }
    }

    private static func heldUIDs(of agentID: String, on c: PostgresConnection) async throws -> Set<String> {
        Set(try await c.rows("SELECT uid FROM agent_uid WHERE agent_id = \(agentID) UNION SELECT uid FROM agent_user WHERE agent_id = \(agentID)")
            .map { try $0.decode(String.self) })
    }


    private func write(_ held: Held) async throws {
        guard !held.isEmpty else { return }
        try await db.write { try await Self.write(held, on: $0) }
    }

    /// Held heartbeats, all in one statement; a time never goes back.
    private static func write(_ held: Held, on c: PostgresConnection) async throws {
        guard !held.isEmpty else { return }
        let entries = held.sorted { $0.key < $1.key }
        let ids = entries.map(\.key), times = entries.map(\.value.at), counts = entries.map(\.value.records)
        try await c.run(
            """
            UPDATE agent SET last_heartbeat_at = h.at, store_records = h.records
            FROM unnest(\(ids)::text[], \(times)::double precision[], \(counts)::bigint[]) AS h(id, at, records)
            WHERE agent.id = h.id AND coalesce(agent.last_heartbeat_at, 0) <= h.at
            """)
    }

    public func holders(of uid: String) async throws -> [UIDHolder] {
        guard UserID.isValid(uid) else { return [] }
        return try await db.read { c in
            try await c.rows(
                """
                SELECT agent_id, max(last_seen_us) FROM (
                    SELECT agent_id, NULL::bigint AS last_seen_us FROM agent_uid WHERE uid = \(uid)
                    UNION ALL
                    SELECT agent_id, last_seen_us FROM agent_user WHERE uid = \(uid)
                ) AS h WHERE agent_id NOT IN (SELECT id FROM agent WHERE revoked_at IS NOT NULL) GROUP BY agent_id ORDER BY agent_id
                """
            ).map { row in
                let (agent, seen) = try row.decode((String, Int64?).self)
                return UIDHolder(agentID: agent, lastSeen: seen.map { Date(timeIntervalSince1970: Double($0) / 1e6) })
            }
        }
    }

    public func revoke(_ agentID: String, by actor: String, at: Date) async throws -> Revocation {
        let channel = PostgresPullQueue.channel(of: db)
        return try await db.write { c in
            guard let row = try await c.rows("SELECT revoked_at FROM agent WHERE id = \(agentID) FOR UPDATE").first else { return .unknown }
            if let revokedAt = try row.decode(Double?.self) { return .alreadyRevoked(Date(timeIntervalSince1970: revokedAt)) }
            try await c.run("UPDATE agent SET revoked_at = \(at.timeIntervalSince1970), revoked_by = \(actor.storable) WHERE id = \(agentID)")
            // Every node, when this commits: the one holding its connection closes it.
            try await c.run("SELECT pg_notify(\(channel), \(PullDispatcher.revokedNotice(agentID)))")
            return .revoked
        }
    }

    public func revoked(among agentIDs: [String]) async throws -> [String] {
        guard !agentIDs.isEmpty else { return [] }
        return try await db.read { c in
            try await c.rows("SELECT id FROM agent WHERE revoked_at IS NOT NULL AND id = ANY(\(agentIDs))").map { try $0.decode(String.self) }
        }
    }

    public func keyGeneration(of agentID: String) async throws -> Int? {
        try await db.read { try await $0.value("SELECT key_generation FROM agent WHERE id = \(agentID)", as: Int.self) }
    }

    public func setKeyGeneration(_ agentID: String, _ generation: Int) async throws {
        _ = try await db.write { try await $0.run("UPDATE agent SET key_generation = \(generation) WHERE id = \(agentID)") }
    }

    public func keyGenerations() async throws -> [Int: Int] {
        try await db.read { c in
            var counts: [Int: Int] = [:]
            for row in try await c.rows("SELECT key_generation, count(*)::bigint FROM agent WHERE revoked_at IS NULL GROUP BY key_generation") {
                let (generation, count) = try row.decode((Int, Int).self)
                counts[generation] = count
            }
            return counts
        }
    }

    public func isRevoked(_ agentID: String) async throws -> Bool {
        try await db.read { try await $0.value("SELECT revoked_at IS NOT NULL FROM agent WHERE id = \(agentID)", as: Bool.self) ?? false }
    }

    public func isEnrolled(_ agentID: String) async throws -> Bool {
        try await db.read { try await $0.value("SELECT 1 FROM agent WHERE id = \(agentID)", as: Int32.self) != nil }
    }

    public func device(_ agentID: String) async throws -> RegisteredDevice? {
        try await db.read { c in
            guard let row = try await c.rows("SELECT hostname, os, app, app_version FROM agent WHERE id = \(agentID)").first else { return nil }
            let (hostname, os, app, appVersion) = try row.decode((String, String, String, String).self)
            return RegisteredDevice(WireHostInfo.with {
                $0.hostname = hostname
                $0.os = os
                $0.app = app
                $0.appVersion = appVersion
            })
        }
    }

    /// Every agent, with the heartbeats this node holds shown over the rows (not written: a
    /// console listing every few seconds must not undo the bounded write rate). Another node's
    /// held heartbeats are not seen: an idle agent's `lastHeartbeatAt` there may be up to the
    /// refresh interval old; whether it is connected is its node's lease, always current.
    public func agents() async throws -> [AgentRecord] {
        let held = hold.peek()
        return try await db.read { c in
            var uids: [String: [String]] = [:]
            for row in try await c.rows("SELECT agent_id, uid FROM agent_uid ORDER BY agent_id, uid") {
                let (agent, uid) = try row.decode((String, String).self)
                uids[agent, default: []].append(uid)
            }
            return try await c.rows(
                """
                SELECT id, hostname, os, app, app_version, labels, enrolled_at, coalesce(connected AND node_id IN (\(unescaped: NodeLease.live)), false), connected_at,
                    remote_address, last_heartbeat_at, users_reported, users_truncated, store_records, revoked_at, revoked_by
                FROM agent ORDER BY hostname, id
                """
            ).map { row in
                let (
                    id, hostname, os, app, appVersion, labels, enrolledAt, connected, connectedAt, remoteAddress, lastHeartbeatAt, usersReported, usersTruncated, storeRecords,
                    revokedAt, revokedBy
                ) = try row.decode((String, String, String, String, String, String, Double, Bool, Double?, String?, Double?, Int64, Bool, Int64, Double?, String?).self)
                let host = WireHostInfo.with {
                    $0.hostname = hostname
                    $0.os = os
                    $0.app = app
                    $0.appVersion = appVersion
                    $0.extra = AgentRows.labels(labels)
                }.bounded
                // A held heartbeat newer than the row's, as the write would make it.
                let newer = held[id].flatMap { $0.at >= (lastHeartbeatAt ?? -.infinity) ? $0 : nil }
                return AgentRecord(
                    agentID: id, hostname: host.hostname, os: host.os, app: host.app, appVersion: host.appVersion,
                    labels: host.extra, enrolledAt: Date(timeIntervalSince1970: enrolledAt), connected: connected,
                    connectedAt: connectedAt.map(Date.init(timeIntervalSince1970:)), remoteAddress: remoteAddress,
                    lastHeartbeatAt: (newer?.at ?? lastHeartbeatAt).map(Date.init(timeIntervalSince1970:)),
                    activeUIDs: uids[id] ?? [], reportedUsers: Int(usersReported), usersTruncated: usersTruncated,
                    storeRecords: UInt64(max(0, newer?.records ?? storeRecords)), revokedAt: revokedAt.map(Date.init(timeIntervalSince1970:)), revokedBy: revokedBy)
            }
        }
    }
}
