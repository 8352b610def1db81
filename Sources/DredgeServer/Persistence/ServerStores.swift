import DredgeAdminAPI
import GRDB
import PostgresNIO
import Logging

/// The server's stores over its one database in a data directory (``ServerDatabase``), opened
/// the one way `dredge-server run`, the command-line tools and the tests open them, and the
/// ``CommandIssuer`` over the deployment's keys.
public struct ServerStores: Sendable {
    public let database: ServerDatabase
    public let registry: SQLiteAgentDirectory
    public let pulls: SQLitePullQueue
    public let feedback: SQLiteFeedbackInbox
    public let tokens: SQLiteTokenVault
    public let tails: SQLiteTailRegistry
    public let triggers: SQLiteTriggerRegistry
    /// The search index, `index.sqlite` beside the database.
    public let records: SQLiteRecordIndex
    public let issuer: CommandIssuer

    public init(_ deployment: LoadedDeployment) throws {
        database = try ServerDatabase(directory: deployment.directory)
        registry = SQLiteAgentDirectory(database)
        pulls = SQLitePullQueue(database)
        feedback = SQLiteFeedbackInbox(database)
        tokens = SQLiteTokenVault(database)
        tails = SQLiteTailRegistry(database)
        triggers = SQLiteTriggerRegistry(database)
        records = try SQLiteRecordIndex.openOrRebuild(directory: deployment.directory)
        issuer = CommandIssuer(keys: deployment.keys)
    }
}

/// The stores a server runs on, whichever the back end: SQLite in the data directory
/// (``ServerStores``), or the PostgreSQL database that `--database` or `server.json`'s
/// `database` names (``PostgresDatabase``), shared by the nodes of a cluster.
public struct ServerPersistence: Sendable {
    public let registry: any AgentDirectory
    public let pulls: any PullQueue & AuditLog
    public let feedback: any FeedbackInbox
    public let tokens: any TokenVault
    /// The live tails (#53).
    public let tails: any TailRegistry
    /// The standing triggers (#54).
    public let triggers: any TriggerRegistry
    public let records: any RecordIndex
    public let issuer: CommandIssuer
    /// Where the state is: the SQLite file, or the database's URL without its password.
    public let location: String
    /// The PostgreSQL database, when the state is there.
    public let postgres: PostgresDatabase?
    /// The SQLite database, when the state is there (the runtime checkpoints its log:
    /// ``WALCheckpointer``).
    public let sqlite: ServerDatabase?
    /// This process's lease as a node of the cluster (PostgreSQL only): the runtime renews it.
    public let node: NodeLease?
    /// Pulls queued by any node, as they are queued (PostgreSQL's notifications); nil on SQLite,
    /// where the dispatcher's sweep finds pulls queued by another process.
    public let notices: (any PullNotices)?
    /// The files of an earlier release this open imported (SQLite only), and what went wrong
    /// renaming them.
    public let imported: [String]
    public let importProblems: [String]

    public init(_ stores: ServerStores) {
        (registry, pulls, feedback, tokens, records, issuer) = (stores.registry, stores.pulls, stores.feedback, stores.tokens, stores.records, stores.issuer)
        tails = stores.tails
        triggers = stores.triggers
        location = stores.database.path
        postgres = nil
        sqlite = stores.database
        node = nil
        notices = nil
        (imported, importProblems) = (stores.database.imported, stores.database.importProblems)
    }

    /// `lease`: how long the node's agents stay present after it stops renewing its lease.
    public init(_ database: PostgresDatabase, deployment: LoadedDeployment, lease: Duration = .seconds(90), logger: Logger = Logger(label: "dredge.server")) {
        let node = NodeLease(database, duration: lease, logger: logger)
        self.node = node
        registry = PostgresAgentDirectory(database, node: node)
        let queue = PostgresPullQueue(database)
        pulls = queue
        notices = queue
        feedback = PostgresFeedbackInbox(database)
        tokens = PostgresTokenVault(database)
        tails = PostgresTailRegistry(database)
        triggers = PostgresTriggerRegistry(database)
        records = PostgresRecordIndex(database, node: node)
        issuer = CommandIssuer(keys: deployment.keys)
        location = database.location.description
        postgres = database
        sqlite = nil
        (imported, importProblems) = ([], [])
    }

    /// Asks the database something (`SELECT 1`): throws when it does not answer.
    public func ping() async throws {
        if let sqlite { try await sqlite.pool.read { try $0.execute(sql: "SELECT 1") } }
        if let postgres { try await postgres.read { c in _ = try await c.run("SELECT 1") } }
    }

    /// What the deployment holds, counted for `GET /metrics`.
    public struct Counts: Sendable, Equatable {
        /// Enrolled and not revoked.
        public var agentsEnrolled = 0
        /// Connected to the deployment: to any node whose lease is current, on PostgreSQL.
        public var agentsOnline = 0
        public var pullTargets: [PullStatus: Int] = [:]
        public var feedback: [FeedbackStatus: Int] = [:]
    }

    /// Counts agents, pull targets and feedback (a few indexed counts; a status read back that
    /// no release writes is left out).
    public func counts() async throws -> Counts {
        var counts = Counts()
        if let sqlite {
            let (agents, pulls, feedback) = try await sqlite.pool.read { db in
                (
                    try Row.fetchOne(db, sql: "SELECT count(*), coalesce(sum(connected), 0) FROM agent WHERE revoked_at IS NULL").map { (Int($0[0] as Int64), Int($0[1] as Int64)) } ?? (0, 0),
                    try Row.fetchAll(db, sql: "SELECT status, count(*) FROM pull_target GROUP BY status").map { ($0[0] as String, Int($0[1] as Int64)) },
                    try Row.fetchAll(db, sql: "SELECT status, count(*) FROM feedback GROUP BY status").map { ($0[0] as String, Int($0[1] as Int64)) }
                )
            }
            (counts.agentsEnrolled, counts.agentsOnline) = agents
            counts.pullTargets = Self.byStatus(pulls)
            counts.feedback = Self.byStatus(feedback)
        }
        if let postgres {
            let (agents, pulls, feedback) = try await postgres.read { c in
                let row = try await c.rows(
                    "SELECT count(*), count(*) FILTER (WHERE connected AND node_id IN (\(unescaped: NodeLease.live))) FROM agent WHERE revoked_at IS NULL"
                ).first
                let agents: (Int64, Int64) = try row?.decode((Int64, Int64).self) ?? (0, 0)
                let pulls = try await c.rows("SELECT status, count(*) FROM pull_target GROUP BY status").map { try $0.decode((String, Int64).self) }
                let feedback = try await c.rows("SELECT status, count(*) FROM feedback GROUP BY status").map { try $0.decode((String, Int64).self) }
                return (agents, pulls, feedback)
            }
            (counts.agentsEnrolled, counts.agentsOnline) = (Int(agents.0), Int(agents.1))
            counts.pullTargets = Self.byStatus(pulls.map { ($0.0, Int($0.1)) })
            counts.feedback = Self.byStatus(feedback.map { ($0.0, Int($0.1)) })
        }
        return counts
    }

    private static func byStatus<Status: RawRepresentable & Hashable>(_ rows: [(String, Int)]) -> [Status: Int] where Status.RawValue == String {
        var counts: [Status: Int] = [:]
        for (raw, count) in rows { if let status = Status(rawValue: raw) { counts[status, default: 0] += count } }
        return counts
    }

    /// Reads ``counts()`` into `metrics` at each scrape; on PostgreSQL also this node's lease
    /// and the cluster's live nodes.
    public func sampler(into metrics: ServerMetrics) -> ServerMetrics.Sampler {
        ServerMetrics.Sampler("database counts") { [self] in
            if let node {
                // A database this node cannot reach is a lease it cannot renew: 0, not the last reading.
                do {
                    let live = try await node.liveNodes()
                    metrics.clusterNodes.set(Double(live.count))
                    metrics.leaseHeld.set(to: live.contains { $0.id == node.id } ? 1 : 0)
                } catch {
                    metrics.leaseHeld.set(to: 0)
                    throw error
                }
            } else {
                metrics.clusterNodes.set(to: 1)
                metrics.leaseHeld.set(to: 1)
            }
            let counts = try await counts()
            metrics.agentsEnrolled.set(Double(counts.agentsEnrolled))
            metrics.agentsOnline.set(Double(counts.agentsOnline))
            for (status, gauge) in metrics.pullTargets { gauge.set(Double(counts.pullTargets[status] ?? 0)) }
            for (status, gauge) in metrics.feedback { gauge.set(Double(counts.feedback[status] ?? 0)) }
            // The key ring as this node has it, and who would be cut off when a generation retires.
            let keys = issuer.keys
            let live = keys.live
            let current = keys.current.number
            let retiring = Set(live.map(\.number).filter { $0 < current })
            metrics.keyGeneration.set(Double(current))
            metrics.keysRetire.set(live.compactMap(\.retiresAt).min()?.timeIntervalSince1970 ?? 0)
            // Agents on generations still live but not current: those on retired ones were cut off already.
            metrics.agentsOnRetiringKeys.set(Double(try await registry.keyGenerations().filter { retiring.contains($0.key) }.values.reduce(0, +)))
        }
    }

    /// Opens the deployment's stores: on PostgreSQL when `database` (else `server.json`'s
    /// `database`) names one, else SQLite in the data directory.
    /// `lease`: a node's lease on PostgreSQL (3 heartbeat intervals).
    public static func open(
        _ deployment: LoadedDeployment, database: String? = nil, lease: Duration = .seconds(90), logger: Logger = Logger(label: "dredge.server")
    ) async throws -> ServerPersistence {
        guard let url = database ?? deployment.config.database else { return ServerPersistence(try ServerStores(deployment)) }
        let location = try PostgresDatabase.Location(url: url)
        if let problem = location.passwordFileProblem { logger.warning("the PostgreSQL password file is not used", metadata: ["reason": "\(problem)"]) }
        let db = try await PostgresDatabase(location, logger: logger)
        return ServerPersistence(db, deployment: deployment, lease: lease, logger: logger)
    }
}
