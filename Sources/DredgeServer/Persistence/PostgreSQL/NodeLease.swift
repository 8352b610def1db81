import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// One `dredge-server` process of a cluster on PostgreSQL, and its lease: a row of the `node`
/// table that the node renews every ``renewEvery`` (a ninth of the lease). Presence is leased
/// through it: an agent is connected while its row says so *and* the node that holds it
/// (`agent.node_id`) renewed its lease within ``duration``. A node that dies (killed, its host
/// gone, cut off from the database) loses its agents' presence within one lease, without any
/// other node writing a thing; a node that starts clears nothing of the others'.
///
/// The lease is measured by the database's clock (`clock_timestamp()`), never a node's, so
/// nodes whose clocks disagree agree on who is alive. The default lease, 90 seconds, is three
/// of the agents' default heartbeat intervals.
///
/// Claims on index sources (``PostgresRecordIndex``) are held by the same lease: a source a
/// dead node was indexing is taken over once its lease has run out.
public final class NodeLease: Service, Sendable {
    /// The node's id: random, new at each start (a restarted node is a new node).
    public let id: String
    /// What people call the node: host name and process id, as the `node` table shows it.
    public let name: String
    public let duration: Duration
    private let db: PostgresDatabase
    private let logger: Logger
    private let joined = Mutex(false)

    public init(_ database: PostgresDatabase, name: String? = nil, duration: Duration = .seconds(90), logger: Logger = Logger(label: "dredge.server")) {
        db = database
        id = UUID().uuidString.lowercased()
        self.name = name ?? "\(ProcessInfo.processInfo.hostName) pid \(ProcessInfo.processInfo.processIdentifier)"
        self.duration = max(duration, .seconds(3))
        self.logger = logger
    }

    public var renewEvery: Duration { duration / 9 }

    /// The database's clock, in seconds since 1970, in SQL.
    static let now = "extract(epoch from clock_timestamp())"
    /// The ids of the nodes whose lease has not run out, in SQL.
    static let live = "SELECT id FROM node WHERE renewed_at + lease_seconds > \(now)"

    private var seconds: Double { Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18 }

    /// Starts (or renews) the lease. Called at start and by every store that records something
    /// under this node (a connection, an index claim) until it has run once.
    public func join() async throws {
        try await renew()
        joined.withLock { $0 = true }
    }

    func joinedOnce() async throws {
        if !joined.withLock({ $0 }) { try await join() }
    }

    /// Renews the lease (or takes it again, if other nodes had forgotten this one).
    public func renew() async throws {
        let (id, name, seconds) = (id, name, seconds)
        try await db.write { c in
            try await c.run(
                """
                INSERT INTO node (id, name, started_at, renewed_at, lease_seconds)
                VALUES (\(id), \(name.storable), \(unescaped: Self.now), \(unescaped: Self.now), \(seconds))
                ON CONFLICT (id) DO UPDATE SET renewed_at = \(unescaped: Self.now), lease_seconds = \(seconds)
                """)
            // Nodes dead for a day are forgotten; their agents' rows already read as offline.
            try await c.run("DELETE FROM node WHERE renewed_at + lease_seconds < \(unescaped: Self.now) - 86400")
        }
    }

    /// Ends the lease at once (a graceful stop): the node's agents read as offline now.
    public func leave() async throws {
        try await db.write { try await $0.run("UPDATE node SET renewed_at = 0 WHERE id = \(self.id)") }
    }

    /// Renews the lease every ``renewEvery`` until the server stops, then ends it. A renewal
    /// that fails is logged and tried again at the next turn: the lease lasts nine of them.
    public func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: self.renewEvery) }
            } catch {
                break
            }
            do {
                try await renew()
            } catch {
                logger.warning("cannot renew this node's lease; its agents read as offline to the cluster if it runs out", metadata: [
                    "node": "\(id)", "lease.seconds": "\(Int(seconds))", "error": "\(error)",
                ])
            }
        }
        do { try await leave() } catch { logger.warning("cannot end this node's lease; it runs out by itself", metadata: ["node": "\(id)", "error": "\(error)"]) }
    }

    /// The nodes whose lease has not run out, by name.
    public func liveNodes() async throws -> [(id: String, name: String)] {
        try await db.read { c in
            try await c.rows("SELECT id, name FROM node WHERE renewed_at + lease_seconds > \(unescaped: Self.now) ORDER BY name, id").map { try $0.decode((String, String).self) }
        }
    }
}
