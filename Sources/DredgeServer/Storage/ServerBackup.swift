import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import Foundation
import GRDB

/// `dredge-server backup` and `dredge-server restore` (#56): a copy of a deployment that a
/// fresh host runs as it was, taken while the server runs.
///
/// **What a backup holds.** `dredge.sqlite` as one snapshot (SQLite's online backup, in one
/// read transaction, so it is consistent whatever the server writes meanwhile); then, read from
/// that snapshot and nothing later: the index without the sources the snapshot does not hold as
/// complete; the keys, the CA, the certificates and `server.json`; the chunks of every upload
/// the snapshot holds as in progress; and (unless left out) the files of every pull target and
/// feedback it holds as complete. So a backup is the deployment as it stood at the snapshot:
///
/// - everything the server acknowledged before the snapshot is in it, with its files;
/// - an upload in progress resumes from the chunks the backup holds (the server reports them to
///   the agent, which sends the rest);
/// - an upload that lands after the snapshot is not in it (nor its files, nor its records):
///   after a restore it is in progress again, and the agent, which let go of it once it was
///   acknowledged, does not send it again: pull it again;
/// - nor is anything else done after the snapshot: a removal (the pull comes back, its files
///   gone), a revocation of an agent or a token (in force again), an enrollment (the device
///   enrolls again).
///
/// Each file is hashed as it is copied (SHA-256) and listed in `dredge-backup.json`; the backup
/// is written under `<to>.partial-<random>` and renamed to `<to>` when it is whole, so an
/// interrupted backup never looks like one. Restore checks every file against the listing
/// before it writes anything, writes under `<data>.restoring-<random>`, and renames it into
/// place: it never leaves half a data directory, and never touches an existing one.
///
/// On PostgreSQL the database is dumped with `pg_dump` from one exported snapshot, and the
/// files follow what that snapshot holds, as above; restore loads the dump with `pg_restore`
/// into an empty schema (``PostgresBackup``).
public enum ServerBackup {
    public static let manifestName = "dredge-backup.json"
    /// The newest backup layout this release reads: 1 for a deployment on SQLite (what every
    /// release since backups wrote), 2 for one on PostgreSQL (a dump, which an older release
    /// cannot restore).
    public static let format = 2

    public struct Manifest: Codable, Sendable, Equatable {
        public var format: Int
        /// The Dredge release that made it.
        public var version: String
        /// To the second (as the listing writes it).
        public var createdAt: Date
        /// The data directory it was taken from.
        public var source: String
        /// The schema steps `dredge.sqlite` had (a release that does not know one cannot open it).
        public var migrations: [String]
        /// Whether the pulled and feedback files are in it (`--no-files` leaves them out).
        public var includesFiles: Bool
        public var counts: Counts
        public var files: [Entry]
        /// What the backup noticed and could not include (files that went while it ran).
        public var notes: [String]
        /// On PostgreSQL: the database's dump (its schema steps are `migrations`).
        public var postgresql: PostgreSQLDump? = nil
    }

    /// A deployment on PostgreSQL: its database is in the backup as `pg_dump`'s custom format.
    public struct PostgreSQLDump: Codable, Sendable, Equatable {
        /// The dump, one of the backup's files.
        public var file: String
        /// The schema its tables are in (a restore goes into a schema of that name).
        public var schema: String
        /// The database's version, and `pg_dump`'s.
        public var serverVersion: String
        public var dumpVersion: String
    }

    public struct Counts: Codable, Sendable, Equatable {
        public var agents = 0
        public var pulls = 0
        public var completeTargets = 0
        public var completeFeedback = 0
        public var uploadsInProgress = 0
        public var chunks = 0
        /// Sources of the index left out: landed after the database's snapshot.
        public var indexSourcesLeftOut = 0
        public var pulledFiles = 0
        public var bytes: Int64 = 0
    }

    /// One file of the backup: its path inside it (and inside the data directory once
    /// restored), its size and its SHA-256 (hex).
    public struct Entry: Codable, Sendable, Equatable {
        public var path: String
        public var bytes: Int64
        public var sha256: String
    }

    /// Backs up the data directory `data` into `destination`, which must not exist.
    ///
    /// - Parameter includeFiles: the pulled and feedback files too (else only the records the
    ///   index holds of them, and their downloads fail after a restore).
    /// - Parameter afterDatabase: runs after the database's snapshot, before anything else is
    ///   read: where a test lets the server move on, to show the rest follows the snapshot.
    /// - Parameter environment: `DREDGE_…` overrides of `server.json` (the database's URL),
    ///   and PostgreSQL's password and tools' `PATH`.
    public static func make(
        data: String, to destination: String, includeFiles: Bool = true, now: Date = Date(),
        environment: [String: String] = ProcessInfo.processInfo.environment, postgresTools: String = "/usr/lib/postgresql",
        afterDatabase: @Sendable () async throws -> Void = {}
    ) async throws -> Manifest {
        let source = DataDirectory(data)
        let deployment = try LoadedDeployment(directory: source.root, environment: environment)
        let postgres = try deployment.config.database.map { try PostgresDatabase.Location(url: $0, environment: environment) }
        let databasePath = source.root + "/" + ServerDatabase.fileName
        guard postgres != nil || FileManager.default.fileExists(atPath: databasePath) else {
            throw DeploymentError("\(source.root) has no \(ServerDatabase.fileName): not a data directory a server has run in")
        }
        let target = URL(fileURLWithPath: destination).standardizedFileURL.path
        guard target != source.root, !target.hasPrefix(source.root + "/") else {
            throw DeploymentError("put the backup outside the data directory, not in \(target)")
        }
        guard !FileManager.default.fileExists(atPath: target) else {
            throw DeploymentError("\(target) exists: a backup never overwrites anything; give a new directory")
        }
        let staging = target + ".partial-" + Hex.encode(secureRandomBytes(4))
        let copier = try BackupCopier(root: staging)
        do {
            // 1. The database, as one snapshot; everything after is read from it.
            let held: ServerHoldings
            var dump: PostgreSQLDump?
            if let postgres {
                // The index is in it: one snapshot holds both.
                let tools = try PostgresBackup.Tools(environment: environment, installations: postgresTools)
                let dumped = try await PostgresBackup.dump(postgres, to: try copier.place(PostgresBackup.dumpName), tools: tools)
                try copier.adopt(PostgresBackup.dumpName)
                (held, dump) = (dumped.holdings, dumped.info)
                try await afterDatabase()
            } else {
                let database = try copier.snapshot(databasePath, as: ServerDatabase.fileName)
                held = try ServerHoldings(database)
                try await afterDatabase()
            }

            // 2. The index, without what landed after the snapshot.
            var counts = held.counts
            let indexPath = source.root + "/" + SQLiteRecordIndex.fileName
            if postgres == nil, FileManager.default.fileExists(atPath: indexPath) {
                try copier.snapshot(indexPath, as: SQLiteRecordIndex.fileName) { db in
                    counts.indexSourcesLeftOut = try held.prune(index: db)
                }
            }

            // 3. Keys, certificates, configuration.
            // The certificate and its key as one pair: never half of a renewal.
            try ServerCertificate.holdingLock(source.root) {
                try ServerCertificate.finishLocked(directory: source.root)
                for name in ["server.pem", "server-key.pem"] { try copier.copy(source.root + "/" + name, as: name) }
            }
            // The key ring and the current keys as one: never half of a rotation.
            try ServerCertificate.holdingLock(source.root, lock: ServerKeyRing.lock) {
                for name in ["signing-key", "encryption-key.pem", ServerKeyRing.file] where name != ServerKeyRing.file || FileManager.default.fileExists(atPath: source.root + "/" + name) {
                    try copier.copy(source.root + "/" + name, as: name)
                }
            }
            for name in ServerDeployment.files where ![ServerDatabase.fileName, "server.pem", "server-key.pem", "signing-key", "encryption-key.pem"].contains(name) {
                try copier.copy(source.root + "/" + name, as: name)
            }
            if FileManager.default.fileExists(atPath: source.root + "/" + ScrapeToken.fileName) {
                try copier.copy(source.root + "/" + ScrapeToken.fileName, as: ScrapeToken.fileName)
            }
            if let tls = deployment.config.adminTLS {
                for file in [tls.certificate, tls.key] {
                    let path = URL(fileURLWithPath: file.hasPrefix("/") ? file : source.root + "/" + file).standardizedFileURL.path
                    let relative = path.hasPrefix(source.root + "/") ? String(path.dropFirst(source.root.count + 1)) : nil
                    if let relative, ServerDeployment.files.contains(relative) || relative == ScrapeToken.fileName { continue }  // copied already
                    var info = stat()
                    if let relative, lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG {
                        try copier.copy(path, as: relative)
                    } else {
                        copier.notes.append("the admin API's \(path) is outside the data directory (or a link) and not in the backup: copy it yourself")
                    }
                }
            }

            // 4. The chunks of the uploads in progress (a chunk that went meanwhile had landed).
            for upload in held.openUploads {
                let directory = try source.upload(upload.id, agent: upload.agentID)
                let relative = String(directory.dropFirst(source.root.count + 1))
                guard try copier.copyIfPresent(directory + "/header.pb", as: relative + "/header.pb") else { continue }
                for name in try copier.listing(directory + "/chunks").sorted() where UInt32(name) != nil && name.allSatisfy(\.isASCII) {
                    if try copier.copyIfPresent(directory + "/chunks/" + name, as: relative + "/chunks/" + name) { counts.chunks += 1 }
                }
            }

            // 5. The files of what is complete.
            if includeFiles {
                for target in held.completeTargets {
                    let files = try source.pullFiles(target.id, agent: target.agentID), zip = try source.pullZip(target.id, agent: target.agentID)
                    counts.pulledFiles += try copier.copyTree(files, within: source, missing: "pull \(target.id)'s files from agent \(target.agentID)")
                    counts.pulledFiles += try copier.copyIfPresent(zip, as: String(zip.dropFirst(source.root.count + 1))) ? 1 : 0
                }
                for feedback in held.completeFeedback {
                    let files = try source.feedbackFiles(feedback.id), zip = try source.feedbackZip(feedback.id)
                    counts.pulledFiles += try copier.copyTree(files, within: source, missing: "feedback \(feedback.id)'s files")
                    counts.pulledFiles += try copier.copyIfPresent(zip, as: String(zip.dropFirst(source.root.count + 1))) ? 1 : 0
                }
            }
            counts.bytes = copier.entries.reduce(0) { $0 + $1.bytes }
            let manifest = Manifest(
                format: dump == nil ? 1 : 2, version: DredgeVersion.current, createdAt: Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down)), source: source.root,
                migrations: held.migrations, includesFiles: includeFiles, counts: counts, files: copier.entries.sorted { $0.path < $1.path }, notes: copier.notes,
                postgresql: dump)
            try copier.finish(manifest: manifest, into: target)
            return manifest
        } catch {
            throw BackupCopier.discard(staging, after: error)
        }
    }

    /// Reads a backup's listing and checks every file against it (size, SHA-256), and that
    /// this release can open what it holds. Nothing is written.
    public static func verify(_ backup: String) throws -> Manifest {
        let root = URL(fileURLWithPath: backup).standardizedFileURL.path
        guard let data = FileManager.default.contents(atPath: root + "/" + manifestName) else {
            throw DeploymentError("\(root) holds no \(manifestName): not a backup (or one still being written)")
        }
        let manifest: Manifest
        do {
            manifest = try JSONDecoder.backup.decode(Manifest.self, from: data)
        } catch {
            throw DeploymentError("\(root)/\(manifestName) does not read: \(error)")
        }
        guard manifest.format <= format else {
            throw DeploymentError("\(root) was made by a newer Dredge (backup format \(manifest.format), this release reads \(format)): restore it with that release")
        }
        let known = Set(manifest.postgresql == nil ? ServerDatabase.migrator(importingFrom: root).migrations : PostgresSchema.migrations.map(\.id))
        let unknown = manifest.migrations.filter { !known.contains($0) }
        guard unknown.isEmpty else {
            throw DeploymentError("\(root)'s database has schema steps this release does not know (\(unknown.joined(separator: ", "))): restore it with Dredge \(manifest.version) or later")
        }
        let paths = DataDirectory(root)
        var seen = Set<String>()
        for entry in manifest.files {
            let path = try checkedPath(entry.path, in: paths)
            guard seen.insert(entry.path).inserted else { throw DeploymentError("\(manifestName) lists \(entry.path) twice") }
            let (bytes, sha) = try BackupCopier.digest(path)
            guard bytes == entry.bytes, sha == entry.sha256 else {
                throw DeploymentError("\(path) is not the file the backup made (\(bytes) bytes, SHA-256 \(sha.prefix(16))…; listed: \(entry.bytes) bytes, \(entry.sha256.prefix(16))…): the backup is damaged")
            }
        }
        for required in requiredFiles(manifest) where !seen.contains(required) {
            throw DeploymentError("\(root) lacks \(required): not a whole backup")
        }
        return manifest
    }

    /// The files every backup holds: the keys, the configuration, and the database (SQLite's,
    /// or the PostgreSQL dump).
    static func requiredFiles(_ manifest: Manifest) -> [String] {
        guard let dump = manifest.postgresql else { return ServerDeployment.files }
        return ServerDeployment.files.filter { $0 != ServerDatabase.fileName } + [dump.file]
    }

    /// Restores the backup `backup` as the data directory `data`, which must not exist (or be
    /// an empty directory; its parents are made). Every file is checked first; nothing is
    /// written if one fails.
    ///
    /// A backup of a deployment on PostgreSQL is loaded into `database` (a URL; else the one the
    /// backup's `server.json` names, else `DREDGE_DATABASE`), whose schema must hold nothing yet,
    /// in one transaction; the restored `server.json` names that database. The data directory
    /// is renamed into place only once the database is restored.
    public static func restore(
        from backup: String, to data: String, database: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment
    ) async throws -> Manifest {
        let manifest = try verify(backup)
        let root = URL(fileURLWithPath: backup).standardizedFileURL.path
        let target = URL(fileURLWithPath: data).standardizedFileURL.path
        var postgres: (url: String, location: PostgresDatabase.Location)?
        if manifest.postgresql != nil {
            guard let url = try databaseToRestoreInto(backup: root, given: database, environment: environment) else {
                throw DeploymentError("\(root) is a backup of a deployment on PostgreSQL: give the database to restore it into (--database postgres://…)")
            }
            postgres = (url, try PostgresDatabase.Location(url: url, environment: environment))
        } else if database != nil {
            throw DeploymentError("\(root) is a backup of a deployment on SQLite: its database is a file of the backup, not a PostgreSQL database")
        }
        var isDirectory: ObjCBool = false
        let exists = FileManager.default.fileExists(atPath: target, isDirectory: &isDirectory)
        if exists {
            guard isDirectory.boolValue, try FileManager.default.contentsOfDirectory(atPath: target).isEmpty else {
                throw DeploymentError("\(target) exists and is not an empty directory: restore never overwrites a data directory; give a new one")
            }
        }
        let parent = (target as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
        } catch {
            throw DeploymentError("cannot make \(parent): \(error)")
        }
        let staging = target + ".restoring-" + Hex.encode(secureRandomBytes(4))
        let copier = try BackupCopier(root: staging)
        do {
            for entry in manifest.files where entry.path != manifest.postgresql?.file {
                let copied = try copier.copy(try checkedPath(entry.path, in: DataDirectory(root)), as: entry.path)
                guard copied.bytes == entry.bytes, copied.sha256 == entry.sha256 else {
                    throw DeploymentError("\(root)/\(entry.path) changed while it was restored")
                }
            }
            if let dump = manifest.postgresql, let postgres {
                try naming(database: postgres.url, keepingPassword: database != nil, in: staging + "/server.json")
                try copier.syncDirectories()
                try await PostgresBackup.restore(
                    try checkedPath(dump.file, in: DataDirectory(root)), schema: dump.schema, into: postgres.location, tools: try PostgresBackup.Tools(environment: environment))
            } else {
                try copier.syncDirectories()
            }
            if exists, rmdir(target) != 0 { throw DeploymentError("cannot replace the empty \(target): \(String(cString: strerror(errno)))") }
            guard rename(staging, target) == 0 else { throw DeploymentError("cannot move the restored directory to \(target): \(String(cString: strerror(errno)))") }
            try BackupCopier.syncDirectory((target as NSString).deletingLastPathComponent)
        } catch {
            throw BackupCopier.discard(staging, after: error)
        }
        return manifest
    }

    /// `url` with its password left out.
    public static func withoutPassword(_ url: String) -> String {
        guard var parts = URLComponents(string: url), parts.password != nil else { return url }
        parts.password = nil
        return parts.string ?? url
    }

    /// Where a backup of a deployment on PostgreSQL is restored: `given`, else the database the
    /// backed-up `server.json` names, else `DREDGE_DATABASE`.
    public static func databaseToRestoreInto(backup root: String, given: String?, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> String? {
        if let given { return given }
        let object = try FileManager.default.contents(atPath: root + "/server.json").map { try JSONSerialization.jsonObject(with: $0) }
        guard let config = object as? [String: Any] else { throw DeploymentError("\(root)/server.json is not a JSON object") }
        return config["database"] as? String ?? environment["DREDGE_DATABASE"]
    }

    /// Rewrites `server.json` (at `path`) to name `database`, leaving every other key as it
    /// is. A password is kept only if `keepingPassword` (given in `--database`, as `init
    /// --database` keeps one, in a file only the server's user reads); one from the
    /// environment stays there.
    static func naming(database: String, keepingPassword: Bool, in path: String) throws {
        guard let data = FileManager.default.contents(atPath: path), var config = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw DeploymentError("\(path) is not a JSON object")
        }
        config["database"] = keepingPassword ? database : withoutPassword(database)
        try DurableFile.write(Array(try JSONSerialization.data(withJSONObject: config, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])), to: path)
    }

    /// A listed path as it lies under `root`: relative, plain names only, inside.
    static func checkedPath(_ relative: String, in root: DataDirectory) throws -> String {
        let parts = relative.split(separator: "/", omittingEmptySubsequences: false)
        guard !relative.hasPrefix("/"), !parts.isEmpty, parts.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." }) else {
            throw DeploymentError("\(manifestName) lists a path that is not a plain relative one: \(relative.prefix(200).debugDescription)")
        }
        return try root.inside(root.root + "/" + relative)
    }
}

extension JSONDecoder {
    static let backup: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()
}

/// What a database snapshot holds, read from the snapshot alone.
struct ServerHoldings {
    struct Ref: Hashable { var id: String; var agentID: String }

    var migrations: [String] = []
    var completeTargets: [Ref] = []
    var completeFeedback: [Ref] = []
    var openUploads: [Ref] = []
    var counts = ServerBackup.Counts()
}

extension ServerHoldings {
    /// Reads `database` (a snapshot no server writes) without changing it.
    init(_ database: String) throws {
        var configuration = Configuration()
        configuration.readonly = true
        let queue = try DatabaseQueue(path: database, configuration: configuration)
        self = try queue.read { db in
            var held = ServerHoldings()
            held.migrations = try String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations ORDER BY rowid")
            let removable = try db.columns(in: "pull").contains { $0.name == "removed_at" }
            let kept = removable ? " AND p.removed_at IS NULL" : ""
            held.completeTargets = try Row.fetchAll(
                db, sql: "SELECT t.pull_id, t.agent_id FROM pull_target t JOIN pull p ON p.id = t.pull_id WHERE t.status = 'complete'\(kept) ORDER BY 1, 2"
            ).map { Ref(id: $0[0], agentID: $0[1]) }
            held.completeFeedback = try Row.fetchAll(
                db, sql: "SELECT id, agent_id FROM feedback WHERE status = 'complete'\(removable ? " AND removed_at IS NULL" : "") ORDER BY 1"
            ).map { Ref(id: $0[0], agentID: $0[1]) }
            let open = PullStatus.allCases.filter { !$0.isFinal }.map { "'\($0.rawValue)'" }.joined(separator: ", ")
            held.openUploads =
                try Row.fetchAll(db, sql: "SELECT pull_id, agent_id FROM pull_target WHERE status IN (\(open)) ORDER BY 1, 2").map { Ref(id: $0[0], agentID: $0[1]) }
                + Row.fetchAll(db, sql: "SELECT id, agent_id FROM feedback WHERE status = 'uploading' ORDER BY 1").map { Ref(id: $0[0], agentID: $0[1]) }
            held.counts.agents = try Int.fetchOne(db, sql: "SELECT count(*) FROM agent") ?? 0
            held.counts.pulls = try Int.fetchOne(db, sql: "SELECT count(*) FROM pull") ?? 0
            held.counts.completeTargets = held.completeTargets.count
            held.counts.completeFeedback = held.completeFeedback.count
            held.counts.uploadsInProgress = held.openUploads.count
            return held
        }
        try queue.close()
    }

    /// Removes from an index snapshot every source this snapshot does not hold as complete
    /// (it landed, or was removed, after the database's snapshot); how many.
    func prune(index db: Database) throws -> Int {
        let complete = Set(completeTargets.map { "pull/\($0.id)/\($0.agentID)" } + completeFeedback.map { "feedback/\($0.id)/\($0.agentID)" })
        var left = 0
        for row in try Row.fetchAll(db, sql: "SELECT id, kind, ref, agent FROM source") {
            let key = "\(row[1] as String)/\(row[2] as String)/\(row[3] as String)"
            guard !complete.contains(key) else { continue }
            try SQLiteRecordIndex.delete(source: row[0], db)
            left += 1
        }
        return left
    }
}

/// Copies files into a new directory (0700, files 0600), hashing each as it goes, and fsyncs
/// them and the directories it made.
final class BackupCopier {
    let root: String
    private(set) var entries: [ServerBackup.Entry] = []
    var notes: [String] = []
    private var directories: Set<String> = []

    init(root: String) throws {
        self.root = root
        guard mkdir(root, 0o700) == 0 else { throw DeploymentError("cannot make \(root): \(String(cString: strerror(errno)))") }
        directories.insert(root)
    }

    /// An SQLite database as one consistent snapshot (the online backup, in one step, in one
    /// read transaction of the source), one file with no log, `edit`ed before it is hashed.
    @discardableResult
    func snapshot(_ source: String, as relative: String, edit: (Database) throws -> Void = { _ in }) throws -> String {
        let path = try place(relative)
        do {
            var readOnly = Configuration()
            readOnly.readonly = true
            readOnly.busyMode = .timeout(10)
            let from = try DatabaseQueue(path: source, configuration: readOnly)
            let to = try DatabaseQueue(path: path)
            try from.backup(to: to)
            try from.close()
            try to.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA journal_mode = DELETE")
                try db.inTransaction {
                    try edit(db)
                    return .commit
                }
            }
            try to.close()
        } catch let error as DeploymentError {
            throw error
        } catch {
            throw DeploymentError("cannot take a snapshot of \(source): \(error)")
        }
        guard chmod(path, 0o600) == 0 else { throw DeploymentError("cannot make \(path) private: \(String(cString: strerror(errno)))") }
        let (bytes, sha) = try Self.digest(path, sync: true)
        entries.append(ServerBackup.Entry(path: relative, bytes: bytes, sha256: sha))
        return path
    }

    /// Copies `source` to `relative`; a missing source is an error.
    @discardableResult
    func copy(_ source: String, as relative: String) throws -> ServerBackup.Entry {
        guard let entry = try copyFile(source, as: relative) else { throw DeploymentError("\(source) is missing") }
        return entry
    }

    /// Copies `source` if it is there (a chunk or a file that went meanwhile is not); whether it was.
    func copyIfPresent(_ source: String, as relative: String) throws -> Bool { try copyFile(source, as: relative) != nil }

    /// Every regular file under `directory` (a pull's or feedback's files); how many. A missing
    /// directory is noted (`missing` says what it is), not an error.
    func copyTree(_ directory: String, within data: DataDirectory, missing: String) throws -> Int {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            notes.append("\(missing) are not in the data directory (removed while the backup ran?)")
            return 0
        }
        var copied = 0
        for name in try listing(directory).sorted() {
            let path = directory + "/" + name
            var info = stat()
            guard lstat(path, &info) == 0 else { continue }
            if (info.st_mode & S_IFMT) == S_IFREG {
                if try copyIfPresent(path, as: String(try data.inside(path).dropFirst(data.root.count + 1))) { copied += 1 }
            } else if (info.st_mode & S_IFMT) == S_IFDIR {
                copied += try copyTree(path, within: data, missing: missing)
            } else {
                notes.append("\(path) is neither a file nor a directory: not in the backup")
            }
        }
        return copied
    }

    /// The names in `directory`; none once it went (an upload that landed, a pull removed,
    /// while the backup ran). Any other failure throws.
    func listing(_ directory: String) throws -> [String] {
        do {
            return try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile || error.code == .fileNoSuchFile {
            return []
        }
    }

    private func copyFile(_ source: String, as relative: String) throws -> ServerBackup.Entry? {
        let input = open(source, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard input >= 0 else {
            if errno == ENOENT { return nil }
            throw DeploymentError("cannot read \(source): \(String(cString: strerror(errno)))")
        }
        defer { close(input) }
        let path = try place(relative)
        let output = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard output >= 0 else { throw DeploymentError("cannot write \(path): \(String(cString: strerror(errno)))") }
        defer { close(output) }
        let (bytes, sha) = try Self.hashBlocks(input, path: source) { chunk in
            var written = 0
            while written < chunk.count {
                let n = write(output, chunk.baseAddress! + written, chunk.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    throw DeploymentError("cannot write \(path): \(String(cString: strerror(errno)))")
                }
                written += n
            }
        }
        guard fsync(output) == 0 else { throw DeploymentError("cannot sync \(path): \(String(cString: strerror(errno)))") }
        let entry = ServerBackup.Entry(path: relative, bytes: bytes, sha256: sha)
        entries.append(entry)
        return entry
    }

    /// A file something else wrote at `place(relative)` (a database dump), hashed, synced and listed.
    func adopt(_ relative: String) throws {
        let path = try ServerBackup.checkedPath(relative, in: DataDirectory(root))
        guard chmod(path, 0o600) == 0 else { throw DeploymentError("cannot make \(path) private: \(String(cString: strerror(errno)))") }
        let (bytes, sha) = try Self.digest(path, sync: true)
        entries.append(ServerBackup.Entry(path: relative, bytes: bytes, sha256: sha))
    }

    /// The path of `relative` under the root, its directories made.
    func place(_ relative: String) throws -> String {
        let path = try ServerBackup.checkedPath(relative, in: DataDirectory(root))
        var directory = (path as NSString).deletingLastPathComponent
        var missing: [String] = []
        while !directories.contains(directory), directory.count > root.count {
            missing.append(directory)
            directory = (directory as NSString).deletingLastPathComponent
        }
        for made in missing.reversed() {
            guard mkdir(made, 0o700) == 0 || errno == EEXIST else { throw DeploymentError("cannot make \(made): \(String(cString: strerror(errno)))") }
            directories.insert(made)
        }
        return path
    }

    /// Writes the listing, syncs what was made, and renames the whole into `target`.
    func finish(manifest: ServerBackup.Manifest, into target: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        try DurableFile.write(Array(try encoder.encode(manifest)), to: root + "/" + ServerBackup.manifestName)
        try syncDirectories()
        guard rename(root, target) == 0 else { throw DeploymentError("cannot move the backup to \(target): \(String(cString: strerror(errno)))") }
        try Self.syncDirectory((target as NSString).deletingLastPathComponent)
    }

    /// Removes a half-made copy of ours after `error`; the error to report (both, if the
    /// removal fails too, so the operator knows what was left).
    static func discard(_ staging: String, after error: any Error) -> any Error {
        guard FileManager.default.fileExists(atPath: staging) else { return error }
        do {
            try FileManager.default.removeItem(atPath: staging)
            return error
        } catch let removal {
            return DeploymentError("\(error); and the half-made \(staging) could not be removed: \(removal)")
        }
    }

    func syncDirectories() throws {
        for directory in directories.sorted(by: { $0.count > $1.count }) { try Self.syncDirectory(directory) }
    }

    static func syncDirectory(_ path: String) throws { try DataDirectory.sync(path) }

    /// A file's size and SHA-256 (hex), read in blocks; synced first when asked.
    static func digest(_ path: String, sync: Bool = false) throws -> (Int64, String) {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw DeploymentError("cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        if sync, fsync(fd) != 0 { throw DeploymentError("cannot sync \(path): \(String(cString: strerror(errno)))") }
        return try hashBlocks(fd, path: path)
    }

    /// Reads `fd` (the file at `path`) to its end in 1 MiB blocks, handing each to `each`; its
    /// size and SHA-256 (hex).
    static func hashBlocks(_ fd: Int32, path: String, _ each: (UnsafeRawBufferPointer) throws -> Void = { _ in }) throws -> (Int64, String) {
        var hash = SHA256()
        var bytes: Int64 = 0
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw DeploymentError("cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            try buffer.withUnsafeBytes { raw in
                let block = UnsafeRawBufferPointer(rebasing: raw[0..<count])
                hash.update(bufferPointer: block)
                try each(block)
            }
            bytes += Int64(count)
        }
        return (bytes, Hex.encode(Array(hash.finalize())))
    }
}
