import ArgumentParser
import DredgeCommandLine
import DredgeServer
import Foundation

struct BackupCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Copy a deployment (database, index, keys, uploads in progress, pulled files) into a new directory, while the server runs.",
        discussion: """
            The database is copied as one snapshot; everything else follows what it holds, so the backup is the deployment \
            as it stood then: what the server acknowledged before is in it with its files, uploads in progress resume from \
            the chunks it holds. Every file is listed with its SHA-256 in dredge-backup.json. On PostgreSQL the database \
            is dumped with pg_dump (which must be installed, no older than the database) from one exported snapshot.
            """)

    @Option(help: "The data directory.")
    var data: String

    @Option(help: "Where the backup goes: a directory that does not exist yet, outside the data directory.")
    var to: String

    @Flag(help: "Leave the pulled and feedback files out (their records stay searchable; their downloads fail after a restore).")
    var noFiles = false

    func run() async throws {
        let manifest: ServerBackup.Manifest
        do {
            manifest = try await ServerBackup.make(data: data, to: to, includeFiles: !noFiles)
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
        let c = manifest.counts
        print("""
            Backed up \(manifest.source) to \(URL(fileURLWithPath: to).standardizedFileURL.path) \
            (\(manifest.files.count) files, \(ByteCountFormatter.string(fromByteCount: c.bytes, countStyle: .binary))):
              database:  \(c.agents) agents, \(c.pulls) pulls (\(c.completeTargets) complete targets), \(c.completeFeedback) feedback
              uploads:   \(c.uploadsInProgress) in progress, \(c.chunks) chunks held
              files:     \(manifest.includesFiles ? "\(c.pulledFiles) pulled and feedback files" : "left out (--no-files)")
            """)
        if c.indexSourcesLeftOut > 0 {
            print("  index:     \(c.indexSourcesLeftOut) source(s) that landed after the database's snapshot left out")
        }
        for note in manifest.notes { print("  note: \(note)") }
        if let dump = manifest.postgresql {
            print("  dump:      PostgreSQL \(dump.serverVersion), schema \(dump.schema), by pg_dump \(dump.dumpVersion), in \(dump.file)")
        }
        print(
            "Restore it with: dredge-server restore --from \(URL(fileURLWithPath: to).standardizedFileURL.path) --data NEW-DIRECTORY"
                + (manifest.postgresql == nil ? "" : " [--database postgres://…NEW-DATABASE]"))
    }
}

struct RestoreCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore",
        abstract: "Make a data directory from a backup, after checking every file of it.",
        discussion: """
            The new data directory must not exist (or be empty). Nothing is written unless every file matches the backup's \
            listing. Agents reconnect by themselves once the server runs where they reach it (the names in server.pem). A \
            backup of a deployment on PostgreSQL is loaded (pg_restore, in one transaction) into --database, else the \
            database its server.json names, whose schema must hold nothing yet.
            """)

    @Option(help: "The backup (a directory `dredge-server backup` made).")
    var from: String

    @Option(help: "The data directory to make.")
    var data: String?

    @Option(help: "A backup of a deployment on PostgreSQL: the database to restore it into (postgres://USER@HOST/DATABASE[?schema=…]; its schema must be empty; the password in PGPASSWORD or a password file, not here: a command line is visible to others). Default: the one the backup's server.json names.")
    var database: String?

    @Flag(help: "Only check the backup (every file against its listing); write nothing.")
    var check = false

    func validate() throws {
        guard check != (data != nil) else { throw ValidationError("give --data, or --check on its own") }
        guard !(check && database != nil) else { throw ValidationError("--check writes nothing: give --database with --data") }
    }

    func run() async throws {
        do {
            if check {
                let manifest = try ServerBackup.verify(from)
                print("\(from): a whole backup of \(manifest.source), made \(manifest.createdAt) by Dredge \(manifest.version): \(manifest.files.count) files, all as listed")
                return
            }
            let manifest = try await ServerBackup.restore(from: from, to: data!, database: database)
            if let dump = manifest.postgresql {
                let url = try ServerBackup.databaseToRestoreInto(backup: from, given: database) ?? ""
                print("Restored the database (schema \(dump.schema)) into \(try PostgresDatabase.Location(url: url)); \(data!)/server.json names it.")
                if ServerBackup.withoutPassword(url) != url {
                    print(
                        database != nil
                            ? "note: server.json keeps the password --database gave (the file is 0600); better: leave it out of the URL and give PGPASSWORD or a password file"
                            : "note: server.json names it without the password: give the server PGPASSWORD or a password file")
                }
            }
            print("""
                Restored \(manifest.files.count) files of \(manifest.source) (backed up \(manifest.createdAt)) into \(data!).
                Re-apply what was done after \(manifest.createdAt): removals, revocations of agents and tokens, enrollments; \
                pull again what was uploaded since.
                Start it with: dredge-server run --data \(data!)
                """)
            if !manifest.includesFiles { print("note: the backup was made with --no-files: the pulled and feedback files are not in it") }
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

struct CertificateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "certificate", abstract: "Show or renew the agent listener's certificate (the server renews it itself 30 days before it expires).",
        subcommands: [CertificateShowCommand.self, CertificateRenewCommand.self], defaultSubcommand: CertificateShowCommand.self)
}

struct CertificateShowCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "The certificate's names, validity and fingerprint.")

    @Option(help: "The data directory.")
    var data: String

    func run() throws {
        do {
            let info = try ServerCertificate.read(directory: data)
            let days = Int(info.left(at: Date()) / 86_400)
            print("""
                names:        \(info.names.joined(separator: ", "))
                valid from:   \(info.notBefore)
                valid until:  \(info.notAfter) (\(days) days left\(info.isDue(at: Date()) ? "; due for renewal" : ""))
                fingerprint:  \(info.fingerprint)
                """)
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

struct CertificateRenewCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "renew",
        abstract: "Renew the certificate now: a new key, signed by the deployment's CA for the names in server.json.",
        discussion: """
            Agents trust the CA, so they accept the new certificate without re-enrolling. A running server hands it to new \
            connections within the hour (at once after a restart); connections open keep theirs.
            """)

    @Option(help: "The data directory.")
    var data: String

    @Flag(help: "Renew even when more than 30 days are left.")
    var force = false

    func run() throws {
        var owner = stat()
        if stat(data, &owner) == 0, owner.st_uid != geteuid() {
            throw fail("run this as the data directory's owner (uid \(owner.st_uid); sudo -u …): a key written as another user is one the server cannot read")
        }
        do {
            let before = try ServerCertificate.read(directory: data)
            guard force || before.isDue(at: Date()) else {
                print("not renewed: valid until \(before.notAfter), more than 30 days away (--force renews anyway)")
                return
            }
            let info = try ServerCertificate.renew(directory: data)
            print("renewed: valid until \(info.notAfter) for \(info.names.joined(separator: ", ")); fingerprint \(info.fingerprint)")
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

struct KeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys", abstract: "Show or rotate the server's command-signing and encryption keys (agents follow without re-enrolling).",
        subcommands: [KeysShowCommand.self, KeysRotateCommand.self], defaultSubcommand: KeysShowCommand.self)
}

struct KeysShowCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "The generations of the server's keys: which is current, and when the others retire.")

    @Option(help: "The data directory.")
    var data: String

    func run() throws {
        do {
            let now = Date()
            for generation in try ServerKeyRing.read(directory: data).reversed() {
                let state =
                    switch generation.retiresAt {
                    case nil: "current"
                    case let at? where at > now: "retires \(at) (\(Self.left(at.timeIntervalSince(now))) left)"
                    case let at?: "retired \(at); forgotten at the server's next look"
                    }
                print("generation \(generation.number): \(state)")
                print("  signing key     \(generation.signingKeyHex)")
                print("  encryption key  sha256:\(generation.encryptionKeyFingerprint)")
            }
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }
}

extension KeysShowCommand {
    /// `29 days`, `36 hours`, `5 minutes`.
    static func left(_ seconds: TimeInterval) -> String {
        if seconds >= 2 * 86_400 { return "\(Int((seconds / 86_400).rounded())) days" }
        if seconds >= 2 * 3_600 { return "\(Int((seconds / 3_600).rounded())) hours" }
        return "\(max(1, Int((seconds / 60).rounded()))) minutes"
    }
}

struct KeysRotateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rotate",
        abstract: "Make the next generation of the command-signing and encryption keys; the current one retires after the overlap.",
        discussion: """
            The new keys are announced to every agent, signed by the current signing key, at its next heartbeat; agents of \
            this release take them without re-enrolling. Until the overlap ends the server still signs commands for agents \
            that have not taken them (an older release, or offline) with the current key, and opens feedback sealed under \
            either. After it, agents still on the old keys are refused and told to enroll again. A running server picks the \
            new keys up within 10 seconds.
            """)

    @Option(help: "The data directory.")
    var data: String

    @Option(help: "How long the current keys stay in use after the rotation: 30d, 12h, 90m.")
    var overlap: String = "30d"

    func run() throws {
        var owner = stat()
        if stat(data, &owner) == 0, owner.st_uid != geteuid() {
            throw fail("run this as the data directory's owner (uid \(owner.st_uid); sudo -u …): a key written as another user is one the server cannot read")
        }
        guard let overlap = Self.duration(overlap), overlap >= .seconds(60), overlap <= ServerKeyRing.maxOverlap else {
            throw fail("--overlap takes a number and a unit (d, h or m), a minute to ten years, e.g. 30d: got \(overlap)")
        }
        do {
            let next = try ServerKeyRing.rotate(directory: data, overlap: overlap)
            let ring = try ServerKeyRing.read(directory: data)
            print("generation \(next.number) is current; agents take it at their next heartbeat once the server has read it (within 10 s)")
            for older in ring.dropLast() {
                print("generation \(older.number) retires \(older.retiresAt.map { "\($0)" } ?? "?")")
            }
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
    }

    /// `30d`, `12h`, `90m`.
    static func duration(_ text: String) -> Duration? {
        guard let unit = text.last, let count = Int(text.dropLast()), count > 0, count <= 10_000_000 else { return nil }
        switch unit {
        case "d": return .seconds(count * 86_400)
        case "h": return .seconds(count * 3_600)
        case "m": return .seconds(count * 60)
        default: return nil
        }
    }
}
