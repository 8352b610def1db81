import DredgeTestSupport
import Foundation
import GRDB
import Testing
@testable import DredgeServer

/// One implementation of the server's persistence protocols, made fresh for each test. The
/// conformance suites run every rule against each backend in ``all``: SQLite in a temporary
/// directory, and PostgreSQL in a schema of its own when `DREDGE_TEST_POSTGRES` names a
/// database (`make test` starts a private cluster and sets it: `scripts/postgres.sh run`).
struct PersistenceBackend: Sendable, CustomTestStringConvertible {
    let name: String
    let pulls: @Sendable (TempDir) async throws -> any PullQueue & AuditLog
    let agents: @Sendable (TempDir) async throws -> any AgentDirectory
    /// The same directory on a clock the test moves (heartbeats flushed at most once a second).
    let agentsOnClock: @Sendable (TempDir, @escaping @Sendable () -> ContinuousClock.Instant) async throws -> any AgentDirectory
    let feedback: @Sendable (TempDir) async throws -> any FeedbackInbox
    let tokens: @Sendable (TempDir) async throws -> any TokenVault
    let records: @Sendable (TempDir) async throws -> any RecordIndex
    /// The tails, and the audit log they write to.
    let tails: @Sendable (TempDir) async throws -> (registry: any TailRegistry, audit: any AuditLog)
    /// The standing triggers, and the audit log they write to.
    let triggers: @Sendable (TempDir) async throws -> (registry: any TriggerRegistry, audit: any AuditLog)
    /// Overwrites a stored pull's filter with text that is not a stored filter (a damaged row),
    /// behind the implementation's back.
    let damageFilter: @Sendable (TempDir, String) async throws -> Void
    /// Runs a statement on the database behind the implementation's back (an intruder's edit).
    let execute: @Sendable (TempDir, String) async throws -> Void
    var testDescription: String { name }

    static let sqlite = PersistenceBackend(
        name: "SQLite",
        pulls: { SQLitePullQueue(try ServerDatabase(directory: $0.path)) },
        agents: { SQLiteAgentDirectory(try ServerDatabase(directory: $0.path)) },
        agentsOnClock: { SQLiteAgentDirectory(try ServerDatabase(directory: $0.path), heartbeatFlush: .seconds(1), clock: $1) },
        feedback: { SQLiteFeedbackInbox(try ServerDatabase(directory: $0.path)) },
        tokens: { SQLiteTokenVault(try ServerDatabase(directory: $0.path)) },
        records: { try SQLiteRecordIndex(directory: $0.path) },
        tails: { dir in
            let db = try ServerDatabase(directory: dir.path)
            return (SQLiteTailRegistry(db), SQLitePullQueue(db))
        },
        triggers: { dir in
            let db = try ServerDatabase(directory: dir.path)
            return (SQLiteTriggerRegistry(db), SQLitePullQueue(db))
        },
        damageFilter: { dir, id in
            try await ServerDatabase(directory: dir.path).pool.write {
                try $0.execute(sql: "UPDATE pull SET filter = '{\"uid\": 7' WHERE id = ?", arguments: [id])
            }
        },
        execute: { dir, sql in try await ServerDatabase(directory: dir.path).pool.write { try $0.execute(sql: sql) } })

    static let postgres = PersistenceBackend(
        name: "PostgreSQL",
        pulls: { PostgresPullQueue(try await TestPostgres.database(for: $0)) },
        agents: { PostgresAgentDirectory(try await TestPostgres.database(for: $0)) },
        agentsOnClock: { PostgresAgentDirectory(try await TestPostgres.database(for: $0), heartbeatFlush: .seconds(1), clock: $1) },
        feedback: { PostgresFeedbackInbox(try await TestPostgres.database(for: $0)) },
        tokens: { PostgresTokenVault(try await TestPostgres.database(for: $0)) },
        records: { PostgresRecordIndex(try await TestPostgres.database(for: $0)) },
        tails: { dir in
            let db = try await TestPostgres.database(for: dir)
            return (PostgresTailRegistry(db), PostgresPullQueue(db))
        },
        triggers: { dir in
            let db = try await TestPostgres.database(for: dir)
            return (PostgresTriggerRegistry(db), PostgresPullQueue(db))
        },
        damageFilter: { dir, id in
            let db = try await TestPostgres.database(for: dir)
            defer { db.close() }
            _ = try await db.write { try await $0.run("UPDATE pull SET filter = '{\"uid\": 7' WHERE id = \(id)") }
        },
        execute: { dir, sql in
            let db = try await TestPostgres.database(for: dir)
            defer { db.close() }
            try await db.execute(unsafeSQL: sql)
        })

    static let all: [PersistenceBackend] = TestPostgres.url == nil ? [.sqlite] : [.sqlite, .postgres]
}

/// Where a server under test keeps its state (the end-to-end suites run against each in ``all``).
enum ServerBackend: String, Sendable, CustomTestStringConvertible, CaseIterable {
    case sqlite = "SQLite"
    case postgres = "PostgreSQL"
    var testDescription: String { rawValue }
    static let all: [ServerBackend] = TestPostgres.url == nil ? [.sqlite] : [.sqlite, .postgres]
}

/// The PostgreSQL database the tests may use, from `DREDGE_TEST_POSTGRES`.
enum TestPostgres {
    static let url = ProcessInfo.processInfo.environment["DREDGE_TEST_POSTGRES"].flatMap { $0.isEmpty ? nil : $0 }

    /// A new, empty database on the tests' server (made with `psql`, as an operator would);
    /// its URL, the test URL's parameters kept.
    static func newDatabase() throws -> String {
        guard let url, var parts = URLComponents(string: url) else { throw DeploymentError("DREDGE_TEST_POSTGRES is not set") }
        let name = "r_" + UUID().uuidString.lowercased().filter { $0.isLetter || $0.isNumber }
        let (status, said) = try ManagedProcess.run("/usr/bin/psql", [url, "-qc", "CREATE DATABASE \(name)"])
        guard status == 0 else { throw DeploymentError("psql could not make a database: \(said)") }
        parts.path = "/" + name
        guard let made = parts.string else { throw DeploymentError("no URL for \(name)") }
        return made
    }

    /// `url` with its tables in `schema`.
    static func url(_ url: String, schema: String) -> String { url + (url.contains("?") ? "&" : "?") + "schema=" + schema }

    /// The test's own schema, named after its temporary directory: the stores a test opens on
    /// one directory share it, as they share the directory's SQLite files.
    static func database(for dir: TempDir) async throws -> PostgresDatabase {
        guard let url else { throw DeploymentError("DREDGE_TEST_POSTGRES is not set") }
        let schema = "t_" + String(dir.url.lastPathComponent.lowercased().filter { $0.isLetter || $0.isNumber }.suffix(40))
        let separator = url.contains("?") ? "&" : "?"
        // A long wait for the first answer: the child-process tests running beside these can
        // hold the test process's few threads for seconds.
        return try await PostgresDatabase(try PostgresDatabase.Location(url: url + separator + "schema=" + schema), connectTimeout: .seconds(300))
    }
}
