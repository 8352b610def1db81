import ArgumentParser
import DredgeDomain
import DredgeCommandLine
import DredgeServer
import Foundation

@main
struct DredgeServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dredge-server",
        abstract: "The Dredge command server.",
        version: DredgeVersion.current,
        subcommands: [InitCommand.self, RunCommand.self, ConfigCommand.self, AgentsCommand.self, PullCommand.self, PullsCommand.self, BackupCommand.self, RestoreCommand.self, CertificateCommand.self, KeysCommand.self])

    /// Everything the server writes (keys, the databases and their write-ahead logs, chunks,
    /// pulled and feedback files in clear, and their directories) is readable by its user only:
    /// 0600 files and 0700 directories, whatever creates them.
    static func main() async {
        umask(0o077)
        Mistyped.exitIfMistyped(Self.self)
        await main(nil)
    }
}

struct InitCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a deployment in a data directory: CA, server certificate, keys and tokens.",
        discussion: "Refuses to overwrite an existing deployment. Prints what agents need to enroll and the admin token, once.")

    @Option(help: "The data directory (created if missing).")
    var data: String

    @Option(help: ArgumentHelp("Address the agent listener binds, HOST or HOST:PORT (a port here wins over --agent-port).", valueName: "host[:port]"))
    var listen = "127.0.0.1"

    @Option(help: "Port of the agent listener (TLS).")
    var agentPort = 7443

    @Option(help: "Port of the admin API.")
    var adminPort = 7080

    @Option(help: ArgumentHelp("Address the admin API binds, HOST or HOST:PORT (default 127.0.0.1). It speaks HTTPS (TLS 1.3) with the deployment's certificate, which names this address.", valueName: "host[:port]"))
    var adminListen: String?

    @Flag(help: "The admin API speaks plain HTTP instead: allowed only on a loopback address.")
    var adminPlainHttp = false

    @Option(help: "Your own certificate chain (PEM) for the admin API instead of the deployment's; with --admin-key.")
    var adminCertificate: String?

    @Option(help: "The private key (PEM) of --admin-certificate.")
    var adminKey: String?

    @Option(help: ArgumentHelp("Keep the server's state in this PostgreSQL database (recorded in server.json) instead of SQLite in the data directory: for several nodes sharing one data directory. postgres://USER@HOST[:PORT]/DATABASE[?sslmode=require]; the password is best given in PGPASSWORD or a password file (PGPASSFILE, ~/.pgpass), not in the URL.", valueName: "url"))
    var database: String?

    @Option(name: .customLong("name"), help: "A host name or IPv4 address agents use to reach the server; repeatable. Goes into the certificate.")
    var names: [String] = []

    func validate() throws {
        let admin = try adminAddress(), agent = try agentAddress()
        guard (1...65_535).contains(agent.port), (1...65_535).contains(admin.port), agent.port != admin.port else {
            throw ValidationError("ports must be distinct and within 1...65535")
        }
        guard (adminCertificate == nil) == (adminKey == nil) else { throw ValidationError("give --admin-certificate and --admin-key together") }
        if adminPlainHttp && adminCertificate != nil { throw ValidationError("--admin-plain-http and --admin-certificate contradict each other") }
    }

    func agentAddress() throws -> (host: String, port: Int) {
        // A bare IPv6 address (`::`, `::1`) is a host; with a port it is written [IPv6]:PORT.
        if !listen.hasPrefix("["), listen.filter({ $0 == ":" }).count >= 2 { return (listen, agentPort) }
        guard let address = HostPort(listen, defaultPort: agentPort) else {
            throw ValidationError("--listen: '\(listen)' is not HOST, HOST:PORT or [IPv6]:PORT")
        }
        return (address.host, address.port)
    }

    func adminAddress() throws -> (host: String, port: Int) {
        guard let adminListen else { return ("127.0.0.1", adminPort) }
        guard let address = HostPort(adminListen, defaultPort: adminPort) else {
            throw ValidationError("--admin-listen: '\(adminListen)' is not HOST, HOST:PORT or [IPv6]:PORT")
        }
        return (address.host, address.port)
    }

    func run() async throws {
        var options = ServerDeployment.Options(dataDirectory: data)
        (options.listenHost, options.agentPort) = try agentAddress()
        (options.adminHost, options.adminPort) = try adminAddress()
        options.adminPlainHTTP = adminPlainHttp
        if let adminCertificate, let adminKey {
            func absolute(_ path: String) -> String { URL(fileURLWithPath: path).standardizedFileURL.path }
            options.adminCertificate = (absolute(adminCertificate), absolute(adminKey))
        }
        options.names = names
        options.database = database
        if let database, URLComponents(string: database)?.password != nil {
            Terminal.error(
                "note: the database's password is kept in server.json (readable by this user only); leave it out of the URL and give it in PGPASSWORD or a password file (PGPASSFILE, ~/.pgpass) to keep it out of files and command lines\n")
        }
        let created: ServerDeployment.Created
        do {
            if let database {
                let location = try PostgresDatabase.Location(url: database)
                if let problem = location.passwordFileProblem { Terminal.error("note: the PostgreSQL password file is not used: \(problem)\n") }
                let db = try await PostgresDatabase(location)
                defer { db.close() }
                created = try await ServerDeployment.initialize(options, database: db)
            } else {
                created = try ServerDeployment.initialize(options)
            }
        } catch let error as DeploymentError {
            throw fail(error.description)
        }
        print("""
            Created a Dredge deployment in \(data).

            What an agent needs to enroll:
              server:          \(created.agentAddress)
              CA certificate:  \(created.caPath)
              CA fingerprint:  \(created.caFingerprint)
              enrollment token: \(created.enrollmentToken)

            Admin token for engineers (shown once; only its hash is stored):
              \(created.adminToken)

            An engineer logs in with (the admin API: \(created.adminURL)):
              \(created.loginCommand)
            """)
    }
}
