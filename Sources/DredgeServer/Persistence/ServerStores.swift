import GRDB
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
    /// The search index, `index.sqlite` beside the database.
    public let records: SQLiteRecordIndex
    public let issuer: CommandIssuer

    public init(_ deployment: LoadedDeployment) throws {
        database = try ServerDatabase(directory: deployment.directory)
        registry = SQLiteAgentDirectory(database)
        pulls = SQLitePullQueue(database)
        feedback = SQLiteFeedbackInbox(database)
        tokens = SQLiteTokenVault(database)
        records = try SQLiteRecordIndex.openOrRebuild(directory: deployment.directory)
        issuer = CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
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
        records = PostgresRecordIndex(database, node: node)
        issuer = CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
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
