import DredgeAdminAPI
@testable import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// `dredge-server backup` and `restore` of a deployment on PostgreSQL (#56): the dump and the
/// holdings come from one exported snapshot, a restore goes into an empty schema in one
/// transaction, and a refusal writes nothing. The processes, with an agent and a pull, are in
/// ``BackupEndToEndTests``.
@Suite struct PostgresBackupTests {
    // MARK: The pure parts

    @Test func theRestoreLeavesOutOnlyTheSchemasOwnEntries() {
        let listing = """
            ;
            ; Archive created at 2026-11-30 01:00:00 UTC
            7; 2615 16392 SCHEMA - e_one dredge
            3357; 0 0 COMMENT - SCHEMA e_one dredge
            8; 2615 16399 SCHEMA - e_one_more dredge
            2045; 3602 16393 TEXT SEARCH CONFIGURATION e_one dredge_text dredge
            216; 1259 16394 TABLE e_one agent dredge
            3351; 0 16394 TABLE DATA e_one agent dredge
            """
        let kept = PostgresBackup.tableOfContents(listing, leavingOut: "e_one").split(separator: "\n")
        #expect(!kept.contains { $0.contains("SCHEMA - e_one ") || $0.contains("COMMENT - SCHEMA e_one ") })
        #expect(kept.contains("8; 2615 16399 SCHEMA - e_one_more dredge"), "another schema's entry stays")
        #expect(kept.contains("216; 1259 16394 TABLE e_one agent dredge") && kept.contains("3351; 0 16394 TABLE DATA e_one agent dredge"))
        #expect(kept.count == 6)
    }

    @Test func theToolsGetThePasswordInTheirEnvironmentAndTheServersTLS() throws {
        let location = try DredgeServer.PostgresDatabase.Location(url: "postgres://dredge:s3cret@db.example:6543/prod?sslmode=require&schema=dredge", environment: [:])
        let env = PostgresBackup.libpqEnvironment(location, inheriting: ["PATH": "/usr/bin", "PGSERVICE": "other", "PGPASSFILE": "/p", "HOME": "/h"])
        #expect(env["PGHOST"] == "db.example" && env["PGPORT"] == "6543" && env["PGUSER"] == "dredge" && env["PGDATABASE"] == "prod")
        #expect(env["PGPASSWORD"] == "s3cret")
        // `require` verifies the certificate and the name, as the server's own connection does.
        #expect(env["PGSSLMODE"] == "verify-full" && env["PGSSLROOTCERT"] == "/etc/ssl/certs/ca-certificates.crt")
        #expect(env["PGSERVICE"] == nil && env["PGPASSFILE"] == "/p" && env["PATH"] == "/usr/bin")
        let plain = try DredgeServer.PostgresDatabase.Location(url: "postgres://dredge@127.0.0.1/dredge?sslmode=disable&sslrootcert=/ca.pem", environment: [:])
        let bare = PostgresBackup.libpqEnvironment(plain, inheriting: ["PGPASSWORD": "inherited"])
        #expect(bare["PGSSLMODE"] == "disable" && bare["PGPASSWORD"] == nil && bare["PGPORT"] == "5432")
    }

    /// Without `pg_dump` the backup says what to install, before it touches the database, and
    /// leaves nothing behind.
    @Test func aBackupWithoutPgDumpSaysWhatToInstall() async throws {
        let place = TempDir()
        let data = place.file("data")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        let path = data + "/server.json"
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        config["database"] = "postgres://dredge@127.0.0.1:1/dredge"
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: path))
        let error = try await #require(throws: DeploymentError.self) {
            try await ServerBackup.make(data: data, to: place.file("backup"), environment: ["PATH": place.path], postgresTools: place.path)
        }
        #expect(error.description.contains("pg_dump is not installed") && error.description.contains("postgresql-client"), "\(error)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: place.path) == ["data"])
    }

    // MARK: On the tests' PostgreSQL

    /// A deployment in a schema of its own, made as `init --database` makes one.
    static func deployment(_ place: TempDir) async throws -> (data: String, url: String, database: DredgeServer.PostgresDatabase) {
        let url = try #require(TestPostgres.url)
        let schema = "b_" + String(place.url.lastPathComponent.lowercased().filter { $0.isLetter || $0.isNumber }.suffix(40))
        var options = ServerDeployment.Options(dataDirectory: place.file("data"))
        options.database = url + (url.contains("?") ? "&" : "?") + "schema=" + schema
        let database = try await DredgeServer.PostgresDatabase(try DredgeServer.PostgresDatabase.Location(url: options.database!), connectTimeout: .seconds(300))
        _ = try await ServerDeployment.initialize(options, database: database)
        return (place.file("data"), options.database!, database)
    }

    /// A new, empty database on the tests' server; its URL with `schema`.
    static func newDatabase(schema: String) throws -> String {
        schema == "public" ? try TestPostgres.newDatabase() : TestPostgres.url(try TestPostgres.newDatabase(), schema: schema)
    }

    @Test(.enabled(if: TestPostgres.url != nil, "needs DREDGE_TEST_POSTGRES (make test starts a cluster)"))
    func theDumpAndTheHoldingsAreOneSnapshotAndARestoreIsAllOrNothing() async throws {
        let place = TempDir()
        let data = place.file("data"), backup = place.file("backup")
        let (_, url, database) = try await Self.deployment(place)
        defer { database.close() }
        let audit = PostgresPullQueue(database), tokens = PostgresTokenVault(database)
        try await audit.record(actor: "alice", action: "before.backup", detail: "", at: Date())

        // What happens after the database's part (pg_dump ended) is in neither the dump nor the
        // counts; a write between the snapshot and pg_dump is ``pgDumpReadsTheExportedSnapshot``.
        let manifest = try await ServerBackup.make(data: data, to: backup) {
            try await audit.record(actor: "alice", action: "after.backup", detail: "", at: Date())
            _ = try await tokens.create(name: "late", kind: .admin, limits: TokenLimits(), now: Date())
        }
        let dump = try #require(manifest.postgresql)
        #expect(manifest.format == 2 && dump.file == PostgresBackup.dumpName && url.hasSuffix("schema=" + dump.schema))
        #expect(manifest.migrations == PostgresSchema.migrations.map(\.id))
        #expect(manifest.files.contains { $0.path == PostgresBackup.dumpName && $0.bytes > 0 })
        #expect(!manifest.files.contains { $0.path == ServerDatabase.fileName || $0.path == SQLiteRecordIndex.fileName })
        #expect(try ServerBackup.verify(backup) == manifest)

        // A schema of another name is refused, and so is a database that holds the schema's
        // tables (here, the deployment's own): nothing is written, the database is untouched.
        let other = try Self.newDatabase(schema: "elsewhere")
        let wrong = try await #require(throws: DeploymentError.self) {
            try await ServerBackup.restore(from: backup, to: place.file("restored"), database: other)
        }
        #expect(wrong.description.contains("the schema \(dump.schema), not elsewhere"), "\(wrong)")
        let occupied = try await #require(throws: DeploymentError.self) {
            try await ServerBackup.restore(from: backup, to: place.file("restored"), database: url)
        }
        #expect(occupied.description.contains("restore into an empty schema"), "\(occupied)")
        #expect(!FileManager.default.fileExists(atPath: place.file("restored")))
        #expect(try FileManager.default.contentsOfDirectory(atPath: place.path).allSatisfy { !$0.contains(".restoring-") })
        #expect(try await tokens.list().count == 3)

        // A damaged dump fails pg_restore's own check and leaves the new database empty.
        let target = try Self.newDatabase(schema: dump.schema)
        let copy = place.file("damaged")
        try FileManager.default.copyItem(atPath: backup, toPath: copy)
        let dumpPath = copy + "/" + dump.file
        var bytes = try Data(contentsOf: URL(fileURLWithPath: dumpPath))
        bytes.removeLast(bytes.count / 2)
        try bytes.write(to: URL(fileURLWithPath: dumpPath))
        var json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: copy + "/" + ServerBackup.manifestName))) as? [String: Any])
        json["files"] = (json["files"] as! [[String: Any]]).map { entry in
            var entry = entry
            if entry["path"] as? String == dump.file { (entry["bytes"], entry["sha256"]) = (bytes.count, try! BackupCopier.digest(dumpPath).1) }
            return entry
        }
        try JSONSerialization.data(withJSONObject: json).write(to: URL(fileURLWithPath: copy + "/" + ServerBackup.manifestName))
        let truncated = try await #require(throws: DeploymentError.self) {
            try await ServerBackup.restore(from: copy, to: place.file("restored"), database: target)
        }
        #expect(truncated.description.contains("pg_restore failed"), "\(truncated)")
        #expect(!FileManager.default.fileExists(atPath: place.file("restored")))
        // Counted with psql, as an operator would (its URL without the server's schema parameter).
        let (counted, tables) = try ManagedProcess.run(
            "/usr/bin/psql", [target.replacingOccurrences(of: "&schema=\(dump.schema)", with: ""), "-tAc", "SELECT count(*) FROM pg_tables WHERE schemaname = '\(dump.schema)'"])
        #expect(counted == 0 && tables.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "\(tables)")

        // Into the new database: the state at the snapshot, and server.json names it.
        let restored = try await ServerBackup.restore(from: backup, to: place.file("restored"), database: target)
        #expect(restored == manifest)
        let loaded = try LoadedDeployment(directory: place.file("restored"), environment: [:])
        #expect(loaded.config.database == target)
        #expect(!FileManager.default.fileExists(atPath: place.file("restored") + "/" + dump.file))
        let again = try await DredgeServer.PostgresDatabase(try DredgeServer.PostgresDatabase.Location(url: target), connectTimeout: .seconds(300))
        defer { again.close() }
        let actions = try await PostgresPullQueue(again).audit(limit: 100).map(\.action)
        #expect(actions.contains("before.backup") && !actions.contains("after.backup"), "\(actions)")
        #expect(try await PostgresTokenVault(again).list().map(\.name).sorted() == ["admin", "default"])
    }

    /// `pg_dump` reads the snapshot the holdings were read from, not the database as it is when
    /// it starts: a write between the two is in neither.
    @Test(.enabled(if: TestPostgres.url != nil, "needs DREDGE_TEST_POSTGRES (make test starts a cluster)"))
    func pgDumpReadsTheExportedSnapshot() async throws {
        let place = TempDir()
        let (_, url, database) = try await Self.deployment(place)
        defer { database.close() }
        let audit = PostgresPullQueue(database)
        let location = try DredgeServer.PostgresDatabase.Location(url: url)
        let tools = try PostgresBackup.Tools(environment: ProcessInfo.processInfo.environment)
        try await audit.record(actor: "alice", action: "before.snapshot", detail: "", at: Date())
        let dumped = try await PostgresBackup.dump(location, to: place.file("db.dump"), tools: tools) {
            try await audit.record(actor: "alice", action: "between.snapshot.and.dump", detail: "", at: Date())
        }
        #expect(dumped.holdings.migrations == PostgresSchema.migrations.map(\.id) && dumped.holdings.counts.pulls == 0)
        #expect(try await audit.audit(limit: 100).map(\.action).contains("between.snapshot.and.dump"))
        let target = try Self.newDatabase(schema: location.schema)
        try await PostgresBackup.restore(place.file("db.dump"), schema: location.schema, into: try DredgeServer.PostgresDatabase.Location(url: target), tools: tools)
        let restored = try await DredgeServer.PostgresDatabase(try DredgeServer.PostgresDatabase.Location(url: target), connectTimeout: .seconds(300))
        defer { restored.close() }
        let actions = try await PostgresPullQueue(restored).audit(limit: 100).map(\.action)
        #expect(!actions.contains("between.snapshot.and.dump") && actions.contains("before.snapshot"), "\(actions)")
    }
}
