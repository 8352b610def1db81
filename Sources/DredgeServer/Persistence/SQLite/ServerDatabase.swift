import DredgeAdminAPI
import Foundation
import GRDB

/// The server's one SQLite database, `dredge.sqlite` in the data directory: agents, the pull
/// queue and audit log, feedback and tokens, each table migrated by the store that owns it
/// (``SQLiteAgentDirectory``, ``SQLitePullQueue``, ``SQLiteFeedbackInbox``, ``SQLiteTokenVault``).
///
/// WAL with `synchronous=NORMAL`, so the listener's frequent small writes (heartbeats, chunk
/// progress) are cheap and the operator's commands (`dredge-server agents`, `pulls`) read
/// without blocking it. The file is made readable by its owner only: it holds wrapped pull keys
/// and token hashes.
///
/// Deployments made before the one database kept `server.sqlite`, `pulls.sqlite`,
/// `feedback.sqlite` and `tokens.json`. The first open imports them, in the same transaction
/// as the migration that records it (a crash part-way imports again from the start), then
/// renames each to `<name>.imported`. A legacy file that cannot be read stops the open with
/// the reason; nothing is half-imported.
public final class ServerDatabase: Sendable {
    public static let fileName = "dredge.sqlite"
    /// The files of deployments made before the one database, in the order they are imported.
    public static let legacyFiles = ["server.sqlite", "pulls.sqlite", "feedback.sqlite", "tokens.json"]
    static let importMigration = "import-legacy-files"

    let pool: DatabasePool
    public let path: String
    /// How long its statements take, once the running server attaches its metrics.
    public let meter: DatabaseMeter
    /// The legacy files this open imported (renamed to `<name>.imported`).
    public let imported: [String]
    /// What went wrong renaming imported files (their contents are in the database already;
    /// the files are left where they are and never imported again).
    public let importProblems: [String]

    public init(directory: String) throws {
        path = directory + "/" + Self.fileName
        let meter = DatabaseMeter()
        self.meter = meter
        pool = try Self.openPool(path, walPages: 8_000, meter: meter)
        let migrator = Self.migrator(importingFrom: directory)
        let applied = try pool.read { try migrator.appliedIdentifiers($0) }
        try migrator.migrate(pool)
        guard !applied.contains(Self.importMigration) else {
            (imported, importProblems) = ([], [])
            return
        }
        var imported: [String] = [], problems: [String] = []
        let fm = FileManager.default
        for name in Self.legacyFiles where fm.fileExists(atPath: directory + "/" + name) {
            imported.append(name)
            for suffix in ["", "-wal", "-shm"] where fm.fileExists(atPath: directory + "/" + name + suffix) {
                let from = directory + "/" + name + suffix
                if rename(from, directory + "/" + name + ".imported" + suffix) != 0 {
                    problems.append("could not rename \(from) after importing it: \(String(cString: strerror(errno)))")
                }
            }
        }
        (self.imported, importProblems) = (imported, problems)
    }

    /// A server database file as the server opens each one: WAL with `synchronous=NORMAL`, a
    /// 10 s busy timeout, and (when it is new) readable by its owner only.
    ///
    /// - Parameter walPages: the log's size at which the writer checkpoints it itself (SQLite's
    ///   default, 1,000, when nil). `dredge.sqlite` waits for 8,000: the running server's
    ///   ``WALCheckpointer`` checkpoints it every 5 s off the writer, and the writer's own
    ///   checkpoint is the bound when that does not run (a command-line tool).
    /// - Parameter meter: times every statement of every connection.
    static func openPool(_ path: String, walPages: Int? = nil, meter: DatabaseMeter? = nil) throws -> DatabasePool {
        let isNew = !FileManager.default.fileExists(atPath: path)
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            if let walPages { try db.execute(sql: "PRAGMA wal_autocheckpoint = \(max(1, walPages))") }
            meter?.profile(db)
        }
        let pool = try DatabasePool(path: path, configuration: configuration)
        if isNew, chmod(path, 0o600) != 0 {
            throw DeploymentError("cannot restrict \(path) to its owner: \(String(cString: strerror(errno)))")
        }
        return pool
    }

    /// Every table's migrations, in order. A migration added later goes after the import: the
    /// legacy files are brought to the schema registered before it, then copied. The token
    /// table's are the exception (``SQLiteTokenVault/schema(_:)``): the import writes whole
    /// ``TokenRow``s, so their columns exist before it (GRDB applies a migration registered
    /// before one already applied, as a database made before it never had it).
    static func migrator(importingFrom directory: String) -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        SQLiteAgentDirectory.legacySchema(&migrator, prefix: "agents-")
        SQLitePullQueue.legacySchema(&migrator)
        SQLiteFeedbackInbox.legacySchema(&migrator)
        SQLiteTokenVault.schema(&migrator)
        migrator.registerMigration(importMigration) { db in
            try LegacyImport(directory: directory).run(into: db)
        }
        // A failed upload keeps the code it was answered with, to answer it again.
        migrator.registerMigration("uploads-v1-error-code") { db in
            try db.execute(sql: """
                ALTER TABLE pull_target ADD COLUMN error_code INTEGER;
                ALTER TABLE feedback ADD COLUMN error_code INTEGER;
                """)
        }
        SQLiteAgentDirectory.schema(&migrator)
        SQLitePullQueue.schema(&migrator)
        // Results deleted (dredge rm, retention) keep their records, marked.
        migrator.registerMigration("results-v1-removed") { db in
            try db.execute(sql: """
                ALTER TABLE pull ADD COLUMN removed_at REAL;
                ALTER TABLE pull ADD COLUMN removed_by TEXT;
                ALTER TABLE pull ADD COLUMN removed_reason TEXT;
                ALTER TABLE feedback ADD COLUMN removed_at REAL;
                ALTER TABLE feedback ADD COLUMN removed_by TEXT;
                ALTER TABLE feedback ADD COLUMN removed_reason TEXT;
                CREATE INDEX pull_kept ON pull(expires_at) WHERE removed_at IS NULL;
                CREATE INDEX feedback_kept ON feedback(received_at) WHERE removed_at IS NULL;
                """)
        }
        // The audit log as a hash chain (AuditChain); the entries before it chained now.
        migrator.registerMigration("audit-v1-chain") { db in
            try db.execute(sql: "ALTER TABLE audit ADD COLUMN hash BLOB")
            try AuditRow.chainExisting(db)
        }
        // A scoped caller's pull keeps its scope, and no agent joins it later (#55).
        migrator.registerMigration("pulls-v6-scope") { db in
            try db.execute(sql: "ALTER TABLE pull ADD COLUMN scope TEXT")
        }
        // Console sessions of people signed in through the identity provider (#55): no token;
        // their role and scope kept with the session.
        migrator.registerMigration("console-sessions-v2-sso") { db in
            try db.execute(sql: "ALTER TABLE console_session ADD COLUMN role TEXT; ALTER TABLE console_session ADD COLUMN scope TEXT")
        }
        // Pulls that wait for a second person's approval (#55).
        migrator.registerMigration("pulls-v7-approval") { db in
            try db.execute(sql: """
                ALTER TABLE pull ADD COLUMN approval_required INTEGER NOT NULL DEFAULT 0;
                ALTER TABLE pull ADD COLUMN approved_by TEXT;
                ALTER TABLE pull ADD COLUMN approved_at REAL;
                """)
        }
        SQLiteTailRegistry.schema(&migrator)
        SQLiteTriggerRegistry.schema(&migrator)
        // Pulls and tails an engineer marks urgent (#54, Protocol § 22).
        migrator.registerMigration("urgent-v1") { db in
            try db.execute(sql: "ALTER TABLE pull ADD COLUMN urgent INTEGER NOT NULL DEFAULT 0; ALTER TABLE tail ADD COLUMN urgent INTEGER NOT NULL DEFAULT 0")
        }
        return migrator
    }
}

/// Copies a pre-database deployment's files into the one database (see ``ServerDatabase``).
struct LegacyImport {
    let directory: String

    func run(into db: Database) throws {
        try copy("server.sqlite", tables: ["agent", "agent_uid"], into: db) { SQLiteAgentDirectory.legacySchema(&$0, prefix: "") }
        try copy("pulls.sqlite", tables: ["pull", "pull_target", "audit"], into: db) { SQLitePullQueue.legacySchema(&$0) }
        try copy("feedback.sqlite", tables: ["feedback"], into: db) { SQLiteFeedbackInbox.legacySchema(&$0) }
        let tokens = directory + "/tokens.json"
        if let data = FileManager.default.contents(atPath: tokens) {
            let file: TokenFile
            do {
                file = try JSONDecoder.adminAPI.decode(TokenFile.self, from: data)
            } catch {
                throw DeploymentError("cannot import \(tokens): \(error)")
            }
            for entry in file.tokens {
                try TokenRow(kind: entry.kind.rawValue, name: entry.name, sha256: entry.sha256, createdAt: entry.createdAt.timeIntervalSince1970).insert(db)
            }
        }
    }

    /// Brings a legacy file to the schema its store had when files were merged (its own
    /// migrations, as that release ran them), then copies its rows, column by column.
    private func copy(_ name: String, tables: [String], into db: Database, schema: (inout DatabaseMigrator) -> Void) throws {
        let path = directory + "/" + name
        guard FileManager.default.fileExists(atPath: path) else { return }
        do {
            let legacy = try DatabaseQueue(path: path)
            var migrator = DatabaseMigrator()
            schema(&migrator)
            try migrator.migrate(legacy)
            try legacy.read { old in
                for table in tables {
                    let rows = try Row.fetchCursor(old, sql: "SELECT * FROM \(table)")
                    while let row = try rows.next() {
                        let columns = row.columnNames.map { "\"\($0)\"" }.joined(separator: ", ")
                        let marks = Array(repeating: "?", count: row.count).joined(separator: ", ")
                        try db.execute(sql: "INSERT INTO \(table) (\(columns)) VALUES (\(marks))", arguments: StatementArguments(row.databaseValues))
                    }
                }
            }
            try legacy.close()
        } catch {
            throw DeploymentError("cannot import \(path) into \(ServerDatabase.fileName): \(error)")
        }
    }
}
