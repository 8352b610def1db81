import Dispatch
import DredgeAdminAPI
import DredgeEnvelope
import DredgePayload
import Foundation
import Logging
import PostgresNIO

/// The PostgreSQL half of `dredge-server backup` and `restore` (#56), with PostgreSQL's own
/// tools (`pg_dump`, `pg_restore`), which must be installed on the host (the
/// `postgresql-client` package), at a version no older than the database's.
///
/// **Backup.** One connection opens a `REPEATABLE READ` read-only transaction and exports its
/// snapshot (`pg_export_snapshot()`). `pg_dump --snapshot` dumps the deployment's schema from
/// that snapshot, and what the backup copies from the data directory (the chunks of uploads in
/// progress, the files of complete pulls) is read from the same transaction
/// (``ServerHoldings``): the dump and the files follow one moment, as a SQLite backup does.
///
/// **Restore** goes into a schema that holds nothing yet (a new database, or one whose schema
/// of that name is empty), in one transaction (`pg_restore --single-transaction`): a restore
/// that fails leaves nothing behind. The `unaccent` extension the search index uses (which
/// lives outside the schema, so is not in the dump) is made first if missing, as the server's
/// first start makes it.
///
/// The database's password never reaches a command line: the tools get it in their
/// environment (`PGPASSWORD`), or find it in the password file as the server does.
enum PostgresBackup {
    /// The dump's name in a backup.
    static let dumpName = "database.dump"

    /// What a dump holds besides its rows, for the backup's listing.
    struct Dumped {
        var holdings: ServerHoldings
        var info: ServerBackup.PostgreSQLDump
    }

    /// Dumps `location`'s schema to `path` (which must not exist) from one snapshot, and reads
    /// the holdings from the same snapshot.
    ///
    /// - Parameter whileHeld: runs once the snapshot is exported and the holdings read, before
    ///   `pg_dump` starts: where a test writes what the dump must not hold.
    static func dump(
        _ location: PostgresDatabase.Location, to path: String, tools: Tools, whileHeld: @Sendable () async throws -> Void = {}
    ) async throws -> Dumped {
        let toolVersion = try await tools.version(of: tools.pgDump)
        return try await withConnection(location) { c in
            try await c.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            guard let snapshot = try await c.value("SELECT pg_export_snapshot()", as: String.self),
                let serverVersion = try await c.value("SELECT current_setting('server_version')", as: String.self)
            else { throw DeploymentError("PostgreSQL exported no snapshot") }
            guard try await c.value(PostgresQuery(unsafeSQL: "SELECT to_regclass('\(location.schema).dredge_migration') IS NOT NULL"), as: Bool.self) == true else {
                throw DeploymentError("\(location) holds no Dredge deployment (no \(location.schema).dredge_migration table): has a server run on it?")
            }
            let holdings = try await ServerHoldings.read(c)
            try await whileHeld()
            _ = try await tools.run(
                tools.pgDump,
                ["--format=custom", "--snapshot=\(snapshot)", "--schema=\(location.schema)", "--no-password", "--file=\(path)"],
                location: location)
            try await c.run("COMMIT")
            return Dumped(holdings: holdings, info: ServerBackup.PostgreSQLDump(file: dumpName, schema: location.schema, serverVersion: serverVersion, dumpVersion: toolVersion))
        }
    }

    /// Restores the dump `path` (of schema `schema`) into `location`, whose schema must be
    /// `schema` and hold nothing yet. All or nothing.
    static func restore(_ path: String, schema: String, into location: PostgresDatabase.Location, tools: Tools) async throws {
        guard location.schema == schema else {
            throw DeploymentError(
                "the backup's tables are in the schema \(schema), not \(location.schema): restore into a database URL with \(schema == "public" ? "no schema parameter" : "?schema=\(schema)")")
        }
        let contents = try await tools.run(tools.pgRestore, ["--list", path], location: nil)
        try await withConnection(location) { c in
            let held = try await c.value(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '\(schema)')
                            + (SELECT count(*) FROM pg_ts_config t JOIN pg_namespace n ON n.oid = t.cfgnamespace WHERE n.nspname = '\(schema)')
                        """), as: Int64.self) ?? 0
            guard held == 0 else {
                throw DeploymentError(
                    "\(location) already holds \(held) table(s), index(es) or other objects in the schema \(schema): restore into an empty schema (a new database) so that nothing is overwritten")
            }
            try await c.run(PostgresQuery(unsafeSQL: "CREATE SCHEMA IF NOT EXISTS \(schema)"))
            if try await c.value("SELECT count(*) FROM pg_extension WHERE extname = 'unaccent'", as: Int64.self) == 0 {
                try await c.run("CREATE EXTENSION IF NOT EXISTS unaccent SCHEMA public")
            }
        }
        // The list in a directory of its own (the backup may be on read-only media).
        let scratch = FileManager.default.temporaryDirectory.path + "/dredge-restore-" + Hex.encode(secureRandomBytes(8))
        guard mkdir(scratch, 0o700) == 0 else { throw DeploymentError("cannot make \(scratch): \(String(cString: strerror(errno)))") }
        defer { try? FileManager.default.removeItem(atPath: scratch) }  // a scratch file: nothing rests on it
        let list = scratch + "/contents.list"
        try DurableFile.write(Array(tableOfContents(contents, leavingOut: schema).utf8), to: list)
        _ = try await tools.run(
            tools.pgRestore,
            ["--single-transaction", "--exit-on-error", "--no-owner", "--no-privileges", "--no-password", "--use-list=\(list)", "--dbname=\(location.database)", path],
            location: location)
    }

    /// `pg_restore --list`'s table of contents without the schema's own entries (its creation
    /// and comment): the restore makes the schema, or finds it empty.
    static func tableOfContents(_ listing: String, leavingOut schema: String) -> String {
        listing.split(separator: "\n", omittingEmptySubsequences: false).filter { line in
            guard !line.hasPrefix(";") else { return true }
            let words = line.split(separator: " ")
            // `ID; TABLEOID OID SCHEMA - NAME OWNER` and `ID; 0 0 COMMENT - SCHEMA NAME OWNER`
            guard words.count >= 6, words[4] == "-" else { return true }
            if words[3] == "SCHEMA", words[5] == schema { return false }
            if words[3] == "COMMENT", words.count >= 7, words[5] == "SCHEMA", words[6] == schema { return false }
            return true
        }.joined(separator: "\n")
    }

    /// Runs `body` on one connection of a pool of its own (no migration: a backup never
    /// changes the database), and closes it.
    static func withConnection<T: Sendable>(_ location: PostgresDatabase.Location, _ body: (PostgresConnection) async throws -> T) async throws -> T {
        // Quiet: the pool's own chatter (a connection it stops making once closed) is not the command's.
        var logger = Logger(label: "dredge.backup")
        logger.logLevel = .error
        let client = PostgresClient(configuration: try location.configuration(), backgroundLogger: logger)
        let runner = Task { await client.run() }
        defer { runner.cancel() }
        do {
            try await PostgresDatabase.waitUntilReachable(client, location: location, timeout: .seconds(30), logger: logger)
            return try await client.withConnection { try await body($0) }
        } catch let error as DeploymentError {
            throw error
        } catch {
            throw DeploymentError("\(location): \(DatabaseFailure.wrapping(error))")
        }
    }

    /// `pg_dump` and `pg_restore`: on the `PATH`, else the newest in `/usr/lib/postgresql/*/bin`
    /// (Debian's layout).
    struct Tools {
        var pgDump: String
        var pgRestore: String
        /// Whose `PATH` and password file the tools get.
        var environment: [String: String]

        /// - Parameter installations: where PostgreSQL's versions are installed (a test's empty directory).
        init(environment: [String: String], installations: String = "/usr/lib/postgresql") throws {
            self.environment = environment
            func find(_ name: String) throws -> String {
                let path = (environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map { "\($0)/\(name)" }
                // A directory that cannot be listed holds no installation.
                let versions = (try? FileManager.default.contentsOfDirectory(atPath: installations)) ?? []
                let installed = versions.compactMap { Int($0) }.sorted(by: >).map { "\(installations)/\($0)/bin/\(name)" }
                guard let found = (path + installed).first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
                    throw DeploymentError("\(name) is not installed (PostgreSQL's client tools: apt-get install postgresql-client), and a backup of a deployment on PostgreSQL needs it")
                }
                return found
            }
            pgDump = try find("pg_dump")
            pgRestore = try find("pg_restore")
        }

        /// `pg_dump --version`'s version.
        func version(of tool: String) async throws -> String {
            let said = try await run(tool, ["--version"], location: nil)
            // "pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)": the first version number.
            return said.firstMatch(of: /\d+(\.\d+)+/).map { String($0.0) } ?? said.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        /// Runs `tool` with `arguments`, connected to `location` through libpq's environment;
        /// what it printed. A failure says what the tool said.
        @discardableResult
        func run(_ tool: String, _ arguments: [String], location: PostgresDatabase.Location?) async throws -> String {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: tool)
            process.arguments = arguments
            process.environment = location.map { PostgresBackup.libpqEnvironment($0, inheriting: environment) } ?? ["PATH": environment["PATH"] ?? "/usr/bin:/bin", "LC_ALL": "C"]
            let output = Pipe(), errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            process.standardInput = FileHandle.nullDevice
            do {
                try process.run()
            } catch {
                throw DeploymentError("cannot run \(tool): \(error)")
            }
            // Both pipes drained off the cooperative threads, so a tool that says much never blocks.
            async let said = Self.drain(output.fileHandleForReading)
            async let complaint = Self.drain(errors.fileHandleForReading)
            let (out, err) = await (said, complaint)
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                DispatchQueue.global().async {
                    process.waitUntilExit()
                    done.resume()
                }
            }
            guard process.terminationReason == .exit, process.terminationStatus == 0 else {
                let name = (tool as NSString).lastPathComponent
                let why = String(decoding: err, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                throw DeploymentError("\(name) failed (\(process.terminationReason == .exit ? "exit \(process.terminationStatus)" : "signal \(process.terminationStatus)")): \(why.isEmpty ? "it said nothing" : String(why.suffix(2000)))")
            }
            return String(decoding: out, as: UTF8.self)
        }

        private static func drain(_ handle: FileHandle) async -> Data {
            await withCheckedContinuation { done in
                DispatchQueue.global().async { done.resume(returning: handle.readDataToEndOfFile()) }
            }
        }
    }

    /// libpq's environment for `location`: the host, port, user, database and TLS as the
    /// server connects (`require` verifies the server's certificate and name, as the server
    /// does, against `sslrootcert` or the system's roots), the password if the server has one.
    /// Other `PG…` variables of the caller's are left out, but for the password file.
    static func libpqEnvironment(_ location: PostgresDatabase.Location, inheriting environment: [String: String]) -> [String: String] {
        var result = environment.filter { !$0.key.hasPrefix("PG") || $0.key == "PGPASSFILE" }
        result["PGHOST"] = location.host
        result["PGPORT"] = String(location.port)
        result["PGUSER"] = location.user
        result["PGDATABASE"] = location.database
        result["PGAPPNAME"] = "dredge-server backup"
        result["PGCONNECT_TIMEOUT"] = "10"
        result["LC_ALL"] = "C"
        switch location.tls {
        case .disable: result["PGSSLMODE"] = "disable"
        case .prefer: result["PGSSLMODE"] = "prefer"
        case .require:
            result["PGSSLMODE"] = "verify-full"
            result["PGSSLROOTCERT"] = location.rootCertificate ?? "/etc/ssl/certs/ca-certificates.crt"
        }
        if let password = location.password { result["PGPASSWORD"] = password }
        return result
    }
}

extension ServerHoldings {
    /// Reads what the database holds on `c`, in the transaction it is in (the dump's snapshot).
    static func read(_ c: PostgresConnection) async throws -> ServerHoldings {
        var held = ServerHoldings()
        let applied = Set(try await c.rows("SELECT id FROM dredge_migration").map { try $0.decode(String.self) })
        let known = PostgresSchema.migrations.map(\.id)
        held.migrations = known.filter { applied.contains($0) } + applied.subtracting(known).sorted()
        func refs(_ query: PostgresQuery) async throws -> [Ref] {
            try await c.rows(query).map { row in
                let (id, agent) = try row.decode((String, String).self)
                return Ref(id: id, agentID: agent)
            }
        }
        held.completeTargets = try await refs(
            "SELECT t.pull_id, t.agent_id FROM pull_target t JOIN pull p ON p.id = t.pull_id WHERE t.status = 'complete' AND p.removed_at IS NULL ORDER BY 1, 2")
        held.completeFeedback = try await refs("SELECT id, agent_id FROM feedback WHERE status = 'complete' AND removed_at IS NULL ORDER BY 1")
        let open = PullStatus.allCases.filter { !$0.isFinal }.map { "'\($0.rawValue)'" }.joined(separator: ", ")
        held.openUploads =
            try await refs(PostgresQuery(unsafeSQL: "SELECT pull_id, agent_id FROM pull_target WHERE status IN (\(open)) ORDER BY 1, 2"))
            + refs("SELECT id, agent_id FROM feedback WHERE status = 'uploading' ORDER BY 1")
        held.counts.agents = Int(try await c.value("SELECT count(*) FROM agent", as: Int64.self) ?? 0)
        held.counts.pulls = Int(try await c.value("SELECT count(*) FROM pull", as: Int64.self) ?? 0)
        held.counts.completeTargets = held.completeTargets.count
        held.counts.completeFeedback = held.completeFeedback.count
        held.counts.uploadsInProgress = held.openUploads.count
        return held
    }
}
